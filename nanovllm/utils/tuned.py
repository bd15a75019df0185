"""Kernel choices measured per GPU model, shipped as JSON beside the kernels that read them (as vLLM ships
tuned kernel configs per device): `<directory>/<prefix>-<GPU name>.json`, written by a benchmark script."""
import functools
import json
import os

import torch


def tuned_path(directory: str, prefix: str, gpu_name: str) -> str:
    return os.path.join(directory, f"{prefix}-{gpu_name.replace(' ', '_')}.json")


def read_tuned(directory: str, prefix: str, gpu_name: str) -> dict:
    """The record measured on this GPU model, or {} if it never was."""
    path = tuned_path(directory, prefix, gpu_name)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


@functools.cache
def device_name(device: torch.device) -> str:
    """The GPU model that tuned tables are keyed by (looked up once per device, not per call)."""
    return torch.cuda.get_device_name(device)


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of this GPU (8 off the GPU, so that CPU runs plan the same kind of grid)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
