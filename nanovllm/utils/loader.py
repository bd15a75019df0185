"""Loading safetensors checkpoints (one file or shards listed in model.safetensors.index.json).

Checkpoint tensor names map onto the model's parameters; q/k/v and gate/up tensors go into the packed
qkv_proj and gate_up_proj through each parameter's `weight_loader` with a shard id. A shard named by the
index but absent, or a parameter no tensor filled, is an error naming it: never random weights.
"""
import json
import logging
import os
from glob import glob

import torch
from safetensors import safe_open
from torch import nn

logger = logging.getLogger(__name__)


def checkpoint_files(model_dir: str) -> list[str]:
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        missing = [s for s in shards if not os.path.exists(os.path.join(model_dir, s))]
        if missing:
            raise FileNotFoundError(f"checkpoint shard(s) {missing} listed in {index_path} are missing")
        return [os.path.join(model_dir, s) for s in shards]
    files = sorted(glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir} (use load_format='dummy' for random "
                                f"weights)")
    return files


def checkpoint_keys(model_dir: str) -> set[str]:
    keys = set()
    for path in checkpoint_files(model_dir):
        with safe_open(path, "pt", "cpu") as f:
            keys.update(f.keys())
    return keys


def iterate_tensors(model_dir: str):
    for path in checkpoint_files(model_dir):
        with safe_open(path, "pt", "cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _target(model: nn.Module, name: str) -> tuple[str, object]:
    """(parameter name in our model, shard id or None) for a checkpoint tensor name: the model's own
    mapping first (an MoE's experts), then its packed modules."""
    target = getattr(model, "checkpoint_target", None)
    found = target(name) if target is not None else None
    if found is not None:
        return found
    for ckpt_name, (packed_name, shard_id) in getattr(model, "packed_modules_mapping", {}).items():
        if f".{ckpt_name}." in name:
            return name.replace(ckpt_name, packed_name), shard_id
    return name, None


def load_model(model: nn.Module, model_dir: str) -> None:
    if getattr(model, "tie_word_embeddings", False) and "lm_head.weight" in checkpoint_keys(model_dir):
        logger.warning("%s: config.json ties the word embeddings, but the checkpoint holds its own "
                       "lm_head.weight: it is used, untied (as transformers does when they differ)", model_dir)
        model.untie_word_embeddings()
    params = dict(model.named_parameters(remove_duplicate=False))
    expected = _expected_shards(model, params)
    loaded: set[tuple[str, object]] = set()
    for ckpt_name, tensor in iterate_tensors(model_dir):
        name, shard_id = _target(model, ckpt_name)
        if name not in params:
            if ckpt_name.endswith(".qweight"):
                raise ValueError(f"checkpoint {model_dir} is quantized ({ckpt_name}) but its config has no "
                                 f"quantization_config (and there is no quant_config.json): restore it, e.g. "
                                 f'{{"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, '
                                 f'"version": "gemm"}}')
            continue   # e.g. rotary inv_freq buffers, or lm_head.weight of a tied model
        param = params[name]
        loader = getattr(param, "weight_loader", None)
        if loader is None:
            _copy_checked(param, tensor.to(param.dtype), ckpt_name)
        elif shard_id is None:
            loader(param, tensor.to(param.dtype), ckpt_name)
        else:
            loader(param, tensor.to(param.dtype), ckpt_name, shard_id)
        loaded.add((name, shard_id))
    if getattr(model, "tie_word_embeddings", False):
        loaded.add(("lm_head.weight", None))
    missing = sorted(f"{n}[{s}]" if s is not None else n for n, s in expected - loaded)
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks tensors for: {', '.join(missing[:8])}"
                         f"{' ...' if len(missing) > 8 else ''}")


def _expected_shards(model: nn.Module, params: dict) -> set[tuple[str, object]]:
    reverse: dict[str, list] = {}
    for ckpt_name, (packed_name, shard_id) in getattr(model, "packed_modules_mapping", {}).items():
        reverse.setdefault(packed_name, []).append(shard_id)
    expected = set()
    for name, param in params.items():
        if hasattr(param, "shard_ids"):      # stacked tensors (an MoE's experts) list their own shards
            expected.update((name, s) for s in param.shard_ids)
            continue
        packed = next((p for p in reverse if f".{p}." in name), None)
        expected.update({(name, s) for s in reverse[packed]} if packed else {(name, None)})
    return expected


def _copy_checked(param: nn.Parameter, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
    param.data.copy_(tensor)


def process_weights_after_loading(model: nn.Module) -> None:
    """Let each layer's quant method turn the checkpoint's tensors into its kernels' layout (AWQ repacks)."""
    for module in model.modules():
        process = getattr(getattr(module, "quant_method", None), "process_weights_after_loading", None)
        if process is not None:
            process(module)


def load_dummy(model: nn.Module, seed: int) -> None:
    """Random weights for benchmarks without downloads (vLLM's load_format='dummy'): norms stay 1."""
    for i, (name, param) in enumerate(model.named_parameters()):
        if "norm" in name:
            continue
        gen = torch.Generator(device=param.device).manual_seed(seed + i)
        if param.dtype.is_floating_point:
            # AWQ scales multiply (q - z) in [-15, 15]: a tenth of the std keeps weights near 0.02 too
            param.data.normal_(0.0, 0.002 if name.endswith(".scales") else 0.02, generator=gen)
        else:   # packed 4-bit weights: any bit pattern is a valid weight
            param.data.random_(-2**31, 2**31 - 1, generator=gen)
