"""AWQ as a linear method: what a checkpoint says about its quantization (`read_awq_config`), the per-layer
parameters in AutoAWQ's GEMM format, their repacking into the kernel layout (awq.py), and the matmul
(`triton_awq.awq_gemm` on a GPU, `awq_gemm_ref` on CPU). Checkpoints name their format in config.json's
`quantization_config` (quant_method "awq") or in an older quant_config.json.
"""
import json
import os
from dataclasses import dataclass, field

import torch
from torch import nn

from nanovllm.quant.awq import PACK, awq_gemm_ref, repack_awq


@dataclass
class AWQConfig:
    """What a checkpoint says about its AWQ quantization."""
    group_size: int
    bits: int = 4
    zero_point: bool = True
    version: str = "gemm"
    modules_to_not_convert: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.bits != 4:
            raise ValueError(f"AWQ with bits={self.bits} is not supported; only 4-bit checkpoints are")
        if not self.zero_point:
            raise ValueError("AWQ with zero_point=false is not supported; only zero-point (asymmetric) checkpoints are")
        if self.version.lower() != "gemm":
            raise ValueError(f"AWQ version {self.version!r} is not supported; only 'gemm' checkpoints load "
                             f"(GEMV packs along the input dimension; re-export with version='gemm')")
        if self.group_size < 1 or self.group_size % PACK:
            raise ValueError(f"AWQ group_size must be a positive multiple of 8, got {self.group_size}")

    def method_for(self, module_name: str):
        if any(skip in module_name for skip in self.modules_to_not_convert):
            return None
        return AWQLinearMethod(self)


def read_awq_config(model_dir: str, hf_config) -> AWQConfig | None:
    """From config.json's quantization_config, else quant_config.json; None for an unquantized model."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is not None:
        qc = qc if isinstance(qc, dict) else qc.to_dict()
        if qc.get("quant_method", "").lower() != "awq":
            raise ValueError(f"quant_method {qc.get('quant_method')!r} is not supported; supported: 'awq'")
        return AWQConfig(group_size=qc["group_size"], bits=qc.get("bits", 4), zero_point=qc.get("zero_point", True),
                         version=qc.get("version", "gemm"),
                         modules_to_not_convert=list(qc.get("modules_to_not_convert") or []))
    path = os.path.join(model_dir, "quant_config.json")
    if os.path.exists(path):
        with open(path) as f:
            qc = json.load(f)
        return AWQConfig(group_size=qc["q_group_size"], bits=qc.get("w_bit", 4), zero_point=qc.get("zero_point", True),
                         version=qc.get("version", "gemm"))
    return None


class AWQLinearMethod:
    """Per-layer AWQ parameters and their matmul."""

    def __init__(self, config: AWQConfig):
        self.group_size = config.group_size

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        g = self.group_size
        if input_size % g or output_size % PACK:
            raise ValueError(f"AWQ group_size={g} must divide the layer's input size {input_size} (per "
                             f"tensor-parallel shard) and 8 its output size {output_size}")
        specs = {"qweight": ((input_size, output_size // PACK), torch.int32, {"output_dim": PACK}),
                 "qzeros": ((input_size // g, output_size // PACK), torch.int32, {"input_dim": g, "output_dim": PACK}),
                 "scales": ((input_size // g, output_size), torch.float16, {"input_dim": g})}
        for name, (shape, dtype, divisors) in specs.items():
            param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
            param.input_dim, param.output_dim, param.divisors = 0, 1, divisors
            layer.register_parameter(name, param)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Repack the loaded checkpoint tensors into the kernel layout (the checkpoint's qzeros go away)."""
        qweight, zeros = repack_awq(layer.qweight.data, layer.qzeros.data, self.group_size)
        del layer.qzeros
        layer.qweight = nn.Parameter(qweight, requires_grad=False)
        layer.zeros = nn.Parameter(zeros, requires_grad=False)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        if x.is_cuda:
            from nanovllm.quant.triton_awq import awq_gemm
            y = awq_gemm(x, layer.qweight, layer.zeros, layer.scales, self.group_size)
        else:
            y = awq_gemm_ref(x, layer.qweight, layer.zeros, layer.scales, self.group_size)
        if bias is not None:
            y = y + bias
        return y.view(*shape[:-1], y.shape[-1])

    def apply_silu_and_mul(self, layer: nn.Module, gate_up: torch.Tensor, bias: torch.Tensor | None):
        """The layer applied to silu(gate) * up of gate_up = [gate | up], for one token on a GPU where the
        Gluon GEMV computes the activation from its input itself (one kernel less per layer); None elsewhere,
        and the caller applies `silu_and_mul` first."""
        if not gate_up.is_cuda or gate_up.numel() != gate_up.shape[-1] or self.group_size != 128:
            return None
        from nanovllm.quant.gluon_awq_gemv import gated_split_k, gluon_awq_gemv
        x = gate_up.reshape(1, -1)
        split_k = gated_split_k(x, layer.qweight.shape[0] * PACK, layer.scales.shape[1])
        if split_k is None:
            return None
        y = gluon_awq_gemv(x, layer.qweight, layer.zeros, layer.scales, split_k=split_k, gated=True)
        if bias is not None:
            y = y + bias
        return y.view(*gate_up.shape[:-1], y.shape[-1])
