"""Kernel choices measured per GPU model, shipped as JSON beside the kernels that read them (as vLLM ships
tuned kernel configs per device): `<directory>/<prefix>-<GPU name>.json`, written by a benchmark script."""
import json
import os


def tuned_path(directory: str, prefix: str, gpu_name: str) -> str:
    return os.path.join(directory, f"{prefix}-{gpu_name.replace(' ', '_')}.json")


def read_tuned(directory: str, prefix: str, gpu_name: str) -> dict:
    """The record measured on this GPU model, or {} if it never was."""
    path = tuned_path(directory, prefix, gpu_name)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)
