"""AWQ W4A16 (AutoAWQ's GEMM format): 4-bit weights with a scale and a zero point per group of inputs.

For a linear layer y = x W with W [in, out] (note: transposed relative to nn.Linear's weight):
    qweight int32 [in, out / 8]          eight 4-bit values per int32, along the output dim
    qzeros  int32 [in / group, out / 8]  packed the same way
    scales  fp16  [in / group, out]
    W[i, o] = (q[i, o] - z[i // group, o]) * s[i // group, o]
AutoAWQ interleaves the eight values in an int32: nibble n (bits 4n..4n+3) holds output column
AWQ_ORDER[n] of its group of eight, so column j sits at bit shift AWQ_SHIFTS[j] = 4 * inverse(AWQ_ORDER)[j].

After loading, each layer is repacked once into the kernel layout (as vLLM repacks AWQ for Marlin):
    qweight int32 [in / 8, out]          eight 4-bit values per int32, along the input dim
    zeros   fp16  [in / group, out]      z itself (exact in fp16)
    scales  fp16  [in / group, out]      unchanged
Word row g * R + r (R = group / 8 rows per group) of column o holds in nibble i (bits 4i..4i+3) the
input k = g * group + i * R + r. A kernel then finds the eight values of a word in one column and one
group, and the eight slices "nibble i of rows r = 0..R-1" are each R consecutive inputs.
The reference path dequantizes the full weight, then matmuls (the CPU path); the Triton kernels
(triton_awq.py, triton_awq_gemv.py) unpack and scale inside the matmul. Checkpoints name their format in
config.json's `quantization_config` (quant_method "awq") or in an older quant_config.json.
"""
import json
import os
from dataclasses import dataclass, field

import torch
from torch import nn

PACK = 8
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_SHIFTS = [4 * AWQ_ORDER.index(j) for j in range(PACK)]     # [0, 16, 4, 20, 8, 24, 12, 28]


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 [rows, cols / 8] -> int32 [rows, cols] of values 0..15 in natural column order."""
    shifts = torch.tensor(AWQ_SHIFTS, dtype=torch.int32, device=packed.device)
    return ((packed[:, :, None] >> shifts) & 0xF).flatten(1)


def as_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words of 32 bits -> int32 with the same bits (the top nibble may set the sign)."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """int [rows, cols] of 0..15 -> int32 [rows, cols / 8] in AutoAWQ's interleaved order."""
    shifts = torch.tensor(AWQ_SHIFTS, dtype=torch.int64, device=values.device)
    grouped = values.to(torch.int64).view(values.shape[0], -1, PACK) << shifts
    return as_int32(grouped.sum(dim=-1))                    # disjoint bits: the sum is the OR


def dequantize_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 W [in, out]."""
    q, z = unpack_awq(qweight), unpack_awq(qzeros)
    z = z.repeat_interleave(group_size, dim=0)
    s = scales.float().repeat_interleave(group_size, dim=0)
    return (q - z).float() * s


def repack_awq(qweight: torch.Tensor, qzeros: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAWQ's qweight [in, out / 8] and qzeros -> the kernel layout: qweight [in / 8, out], zeros fp16."""
    q = unpack_awq(qweight)                                        # [in, out]
    rows = group_size // PACK
    q = q.view(q.shape[0] // group_size, PACK, rows, -1).to(torch.int64)   # [group, nibble i, row r, out]
    words = sum(q[:, i] << (4 * i) for i in range(PACK)).flatten(0, 1)     # [in / 8, out]
    return as_int32(words), unpack_awq(qzeros).to(torch.float16)


def kernel_layout(tensors: dict[str, torch.Tensor], group_size: int) -> dict[str, torch.Tensor]:
    """A checkpoint layer's {qweight, qzeros, scales} -> {qweight, zeros, scales} in the kernel layout."""
    qweight, zeros = repack_awq(tensors["qweight"], tensors["qzeros"], group_size)
    return {"qweight": qweight, "zeros": zeros, "scales": tensors["scales"]}


def dequantize_packed(qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                      group_size: int) -> torch.Tensor:
    """float32 W [in, out] from the kernel layout (see the module docstring)."""
    rows = group_size // PACK
    words = qweight.view(-1, rows, qweight.shape[1])                      # [group, row r, out]
    q = torch.stack([(words >> (4 * i)) & 0xF for i in range(PACK)], dim=1).flatten(0, 2)   # [in, out]
    z, s = (t.float().repeat_interleave(group_size, 0) for t in (zeros, scales))
    return (q.float() - z) * s


def awq_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                 group_size: int) -> torch.Tensor:
    """x [tokens, in] -> [tokens, out] with weights in the kernel layout: dequantize, then matmul (the
    specification and the CPU path)."""
    return x @ dequantize_packed(qweight, zeros, scales, group_size).to(x.dtype)


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
