"""Shipped config.json files of real architectures, for load_format='dummy' runs without downloads."""
import json
import os
import shutil
import tempfile

CONFIGS_DIR = os.path.dirname(__file__)


def shipped_config_dir(name: str) -> str:
    """A shipped model name ('Qwen3-0.6B', 'Qwen3-8B', 'Llama-3.1-8B', 'Llama-3.2-1B', 'Qwen2.5-7B',
    'Mistral-7B-v0.3': the published config.json of each) -> the folder holding its config.json."""
    path = os.path.join(CONFIGS_DIR, name)
    if not os.path.exists(os.path.join(path, "config.json")):
        names = sorted(d for d in os.listdir(CONFIGS_DIR) if os.path.isdir(os.path.join(CONFIGS_DIR, d)))
        raise ValueError(f"no shipped config {name!r}; shipped: {names}")
    return path


def shipped_config_names() -> list[str]:
    return sorted(d for d in os.listdir(CONFIGS_DIR) if os.path.isfile(os.path.join(CONFIGS_DIR, d, "config.json")))


def with_awq_config(model_dir: str, group_size: int = 128) -> str:
    """A temporary copy of model_dir's config.json declaring AutoAWQ 4-bit GEMM weights, for running AWQ
    shapes with load_format='dummy'."""
    out = tempfile.mkdtemp(prefix="awq-dummy-")
    for name in os.listdir(model_dir):
        if name.endswith(".json") and "safetensors" not in name:
            shutil.copy(os.path.join(model_dir, name), out)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size,
                                     "zero_point": True, "version": "gemm", "modules_to_not_convert": None}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    return out
