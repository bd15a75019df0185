"""Tiny AWQ checkpoints made from tiny random Qwen3 models, and HF models running their dequantized weights."""
import json
import os

from safetensors.torch import load_file, save_file
from tiny_models import make_tiny_arch, make_tiny_model

from nanovllm.quant.awq import dequantize_awq
from nanovllm.quant.awq_quantize import quantize_model

GROUP = 32


def make_awq_model(path: str, method: str = "rtn", calib=None, group: int = GROUP, arch: str | None = None, **cfg):
    """Save an AWQ (GEMM format) checkpoint of a tiny random model (Qwen3, or `arch` of the decoder
    family); returns the float32 HF model. Biases stay float16 tensors, as AutoAWQ keeps them."""
    hf = make_tiny_arch(path, arch, **cfg) if arch else make_tiny_model(path, **cfg)
    tensors = quantize_model(hf, calib, group, method)
    os.remove(os.path.join(path, "model.safetensors"))
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                     "version": "gemm", "modules_to_not_convert": None}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return hf


def dequantized_hf(path: str, hf, group: int = GROUP):
    """The HF model with every linear weight replaced by the checkpoint's dequantized weight."""
    tensors = load_file(os.path.join(path, "model.safetensors"))
    state = hf.state_dict()
    for name in list(state):
        prefix = name[:-len(".weight")]
        if f"{prefix}.qweight" in tensors:
            w = dequantize_awq(tensors[f"{prefix}.qweight"], tensors[f"{prefix}.qzeros"],
                               tensors[f"{prefix}.scales"], group)
            state[name] = w.t().contiguous()
        elif name in tensors:
            state[name] = tensors[name].float()
    hf.load_state_dict(state)
    return hf
