"""Fused AWQ dequant-GEMM in Triton: y [M, N] = x [M, K] @ W [K, N], W never materialized.

Weights are in the kernel layout of awq.py: qweight [K / 8, N], whose word row g * R + r (R = group / 8)
holds in nibble i the input k = g * group + i * R + r. One loop step covers one group. Its R word rows
give eight [R, BLOCK_N] slices, "nibble i", and slice i multiplies the R consecutive inputs
x[:, g * group + i * R : ... + R], so the group is eight tensor-core dots of depth R with no reshuffle.

A nibble becomes a float without a conversion instruction (`magic_nibble`): moved to bits 16..19 and
OR-ed into 128.0 (0x43000000), whose mantissa bit 16 is worth exactly 1, it reads as the float 128 + q.
Here each slice becomes q - z = (128 + q) - (128 + z), exact in bf16/fp16, the dot accumulates in float32
and the group's scale multiplies the dot's result, not every weight. When the output tiles are too few to
fill the GPU, K is split over programs; the last program of each tile adds the partial sums in split order
(`finish_split_k`). For a few tokens (decode) triton_awq_gemv.py streams the weight through FMAs; for many
(prefill) the weight is dequantized once into a temporary and cuBLAS multiplies (`awq_dequantize`).
On Hopper, gluon_awq_mma.py multiplies batches of tokens on the tensor cores with the weight dequantized in
registers. `awq_gemm` picks the method that benchmarks/bench_gemm.py measured fastest on this GPU model and layer
shape. Reference: `awq_gemm_ref` (dequantize, then matmul).
"""
import functools

import torch
import triton
import triton.language as tl

from nanovllm.quant.awq import dequantize_packed
from nanovllm.quant.awq_common import (
    MAGIC_BITS,
    MAX_TILES,
    TUNED_DIR,
    finish_split_k,
    magic_nibble,
    measured_at,
    split_k_buffers,
    split_k_for,
    tile_counters,
)
from nanovllm.utils.precision import dot_precision
from nanovllm.utils.tuned import device_name, read_tuned, tuned_path

__all__ = ["awq_gemm", "awq_dequantize", "tile_counters"]
DEQUANT_MIN_TOKENS = 128   # without a measured table: from this many tokens on, dequantize once + cuBLAS
GEMV_MAX_TOKENS = 8        # the FMA kernel shares the unpacking between tokens, but not the FMAs


@triton.jit
def _awq_gemm_kernel(x_ptr, qweight_ptr, zeros_ptr, scales_ptr, out_ptr, partial_ptr, count_ptr, M, N, K,
                     stride_xm, stride_om, magic, split_k, GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    ROWS: tl.constexpr = GROUP_SIZE // 8
    tile, pid_k = tl.program_id(0), tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile // num_n, tile % num_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, ROWS)
    m_ok, n_ok = offs_m < M, offs_n < N
    x_rows = x_ptr + offs_m[:, None] * stride_xm + offs_r[None, :]
    num_groups = K // GROUP_SIZE
    per_split = tl.cdiv(num_groups, split_k)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for g in range(pid_k * per_split, tl.minimum((pid_k + 1) * per_split, num_groups)):
        words = tl.load(qweight_ptr + (g * ROWS + offs_r)[:, None] * N + offs_n[None, :], mask=n_ok[None, :],
                        other=0)                                                   # [ROWS, BLOCK_N]
        s = tl.load(scales_ptr + g * N + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        magic_z = 128.0 + tl.load(zeros_ptr + g * N + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        part = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for i in tl.static_range(8):
            x = tl.load(x_rows + g * GROUP_SIZE + i * ROWS, mask=m_ok[:, None], other=0.0)   # [BLOCK_M, ROWS]
            w = (magic_nibble(words, i, magic) - magic_z[None, :]).to(x.dtype)           # q - z, exact
            part = tl.dot(x, w, part, input_precision=DOT_PRECISION)
        acc += part * s[None, :]
    finish_split_k(acc, out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
                   partial_ptr + offs_m[:, None] * N + offs_n[None, :], M * N, count_ptr + tile,
                   m_ok[:, None] & n_ok[None, :], pid_k, split_k)


@triton.jit
def _awq_dequantize_kernel(qweight_ptr, zeros_ptr, scales_ptr, out_ptr, N, GROUP_SIZE: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    ROWS: tl.constexpr = GROUP_SIZE // 8
    g, pid_n = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, ROWS)
    n_ok = offs_n < N
    words = tl.load(qweight_ptr + (g * ROWS + offs_r)[:, None] * N + offs_n[None, :], mask=n_ok[None, :], other=0)
    z = tl.load(zeros_ptr + g * N + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    s = tl.load(scales_ptr + g * N + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    for i in tl.static_range(8):
        w = (((words >> (4 * i)) & 0xF).to(tl.float32) - z) * s
        rows = g * GROUP_SIZE + i * ROWS + offs_r
        tl.store(out_ptr + rows[:, None] * N + offs_n[None, :], w.to(out_ptr.dtype.element_ty), mask=n_ok[None, :])


def awq_dequantize(qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """W [K, N] in `dtype` (the reference is `dequantize_packed`); for many tokens, W once + cuBLAS beats
    unpacking W inside every tile of a long GEMM."""
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    assert qweight.is_contiguous() and zeros.is_contiguous() and scales.is_contiguous()
    if not rows_form_a_block(group_size):
        return dequantize_packed(qweight, zeros, scales, group_size).to(dtype)
    out = torch.empty(K, N, dtype=dtype, device=qweight.device)
    grid = (K // group_size, triton.cdiv(N, 256))
    _awq_dequantize_kernel[grid](qweight, zeros, scales, out, N, GROUP_SIZE=group_size, BLOCK_N=256, num_warps=4)
    return out


AWQ_METHODS = ("gemv", "fused", "mma", "mma256", "dequant")


def tuned_methods_path(gpu_name: str) -> str:
    return tuned_path(TUNED_DIR, "awq", gpu_name)


@functools.cache
def tuned_methods(gpu_name: str, k: int = 0, n: int = 0) -> list[tuple[int, str]]:
    """[(token count, fastest method)] that `benchmarks/bench_gemm.py --write` measured on this GPU model:
    for the layer shape [k, n] when it was measured (the winner differs per shape), else summed over the
    measured layers."""
    record = read_tuned(TUNED_DIR, "awq", gpu_name)
    if not record:
        return []
    fastest = record.get("fastest_by_shape", {}).get(f"{k}x{n}", record["fastest"])
    return sorted((int(tokens), method) for tokens, method in fastest.items())


def pick_method(num_tokens: int, table: list[tuple[int, str]]) -> str:
    """The measured winner (`measured_at`); without measurements (empty table), the FMA kernel up to
    GEMV_MAX_TOKENS, dequantize + cuBLAS from DEQUANT_MIN_TOKENS tokens on, else the fused tensor-core kernel."""
    if table:
        return measured_at(num_tokens, table)
    if num_tokens <= GEMV_MAX_TOKENS:
        return "gemv"
    return "dequant" if num_tokens >= DEQUANT_MIN_TOKENS else "fused"


def supported_methods(num_tokens: int, group_size: int, x: torch.Tensor | None = None) -> tuple[str, ...]:
    """The kernels need the group's word rows (group / 8) as a power of 2, the tensor-core dots 16+ of them;
    dequantize + cuBLAS runs any group (in PyTorch when the Triton kernel cannot). "mma" and "mma256"
    (gluon_awq_mma.py) need a Hopper GPU and 16-bit tokens `x`."""
    if not rows_form_a_block(group_size):
        return ("dequant",)
    from nanovllm.quant.gluon_awq_mma import TILES, mma_supported
    gemv = ("gemv",) if num_tokens <= GEMV_MAX_TOKENS else ()
    mma = tuple(TILES) if x is not None and mma_supported(x, group_size) else ()
    return gemv + (("fused",) if group_size // 8 >= 16 else ()) + mma + ("dequant",)


def rows_form_a_block(group_size: int) -> bool:
    """The Triton kernels hold a group's group / 8 word rows as one block, whose size must be a power of 2."""
    return group_size // 8 == triton.next_power_of_2(group_size // 8)


def awq_gemm(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
             group_size: int, method: str | None = None, split_k: int | None = None, **gemv_settings) -> torch.Tensor:
    """x [M, K] (bf16, fp16 or fp32) -> [M, N] in x's dtype, weights in the kernel layout of awq.py.
    `method`: "gemv" (FMA kernel, up to GEMV_MAX_TOKENS tokens), "fused" (tensor-core dots, this file),
    "mma" (wgmma with the weight in registers, Hopper; gluon_awq_mma.py; "mma256": 256 output columns per
    program instead of 128), "dequant" (dequantize + cuBLAS);
    None: the measured winner (`pick_method`) among the supported ones."""
    M, K = x.shape
    N = scales.shape[1]
    assert qweight.shape == (K // 8, N) and zeros.shape == scales.shape == (K // group_size, N), \
        "AWQ weights must be repacked into the kernel layout (AWQLinearMethod.process_weights_after_loading)"
    assert qweight.dtype == torch.int32 and qweight.is_contiguous() and x.stride(-1) == 1
    supported = supported_methods(M, group_size, x)
    if method is None:
        table = tuned_methods(device_name(x.device), K, N) if x.is_cuda else []
        method = pick_method(M, table)
        method = method if method in supported else supported[0]
    assert method in supported, f"method {method!r} cannot run {M} tokens with group {group_size}: {supported}"
    if method == "dequant":
        return x @ awq_dequantize(qweight, zeros, scales, group_size, x.dtype)
    if method == "gemv":
        from nanovllm.quant.triton_awq_gemv import awq_gemv
        return awq_gemv(x, qweight, zeros, scales, group_size, split_k=split_k, **gemv_settings)
    if method.startswith("mma"):
        from nanovllm.quant.gluon_awq_mma import TILES, gluon_awq_mma
        block_n, warps = TILES[method]
        return gluon_awq_mma(x, qweight, zeros, scales, split_k=split_k, block_n=block_n, warps=warps)
    block_m = 16 if M <= 16 else (32 if M <= 32 else (64 if M <= 64 else 128))
    block_n = 128
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    if split_k is None:     # split K until the GPU has ~2 programs per SM, in whole groups
        split_k = split_k_for(2, tiles, K // group_size, x.device)
    assert tiles <= MAX_TILES
    out, partial, counters = split_k_buffers(M, N, split_k, x)
    _awq_gemm_kernel[(tiles, split_k)](x, qweight, zeros, scales, out, partial, counters, M, N, K,
                                       x.stride(0), out.stride(0), MAGIC_BITS, split_k, GROUP_SIZE=group_size,
                                       BLOCK_M=block_m, BLOCK_N=block_n, DOT_PRECISION=dot_precision(x.dtype),
                                       num_warps=4 if M <= 64 else 8, num_stages=3)
    return out
