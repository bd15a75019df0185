"""Shipped config.json files of real architectures, for load_format='dummy' runs without downloads."""
import os

CONFIGS_DIR = os.path.dirname(__file__)


def shipped_config_dir(name: str) -> str:
    """'Qwen3-0.6B' or 'Qwen3-8B' -> the folder holding its config.json."""
    path = os.path.join(CONFIGS_DIR, name)
    if not os.path.exists(os.path.join(path, "config.json")):
        names = sorted(d for d in os.listdir(CONFIGS_DIR) if os.path.isdir(os.path.join(CONFIGS_DIR, d)))
        raise ValueError(f"no shipped config {name!r}; shipped: {names}")
    return path
