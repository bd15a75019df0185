"""Fused AWQ dequant-GEMM in Triton: y [M, N] = x [M, K] @ W [K, N], W never materialized.

Each program computes a [BLOCK_M, BLOCK_N] tile of y. For each K tile it loads the packed int32 words once
([BLOCK_K, BLOCK_N / 8], contiguous rows), repeats each word eight times in registers (three
tl.interleave), and shifts out the 4-bit values in AutoAWQ's order (column j of eight sits at bit shift
4 * (4 * (j % 2) + j // 2), which is AWQ_SHIFTS). BLOCK_K divides the group size, so one K tile lies in one
group: its zero points ([BLOCK_N / 8] words) and scales ([BLOCK_N]) are one row each. w = (q - z) * s is
fed to tl.dot in the activation dtype; accumulation in float32. For few tokens (decode) the K loop is
split over SPLIT_K programs that add their partial sums atomically into a float32 buffer, so the weight
read is spread over the whole GPU. From DEQUANT_MIN_TOKENS tokens on (prefill), the weight is
dequantized once into a temporary and cuBLAS does the matmul, which beats unpacking inside every tile.
Reference: `awq_gemm_ref` (dequantize, then matmul).
"""
import functools
import os

import torch
import triton
import triton.language as tl

from nanovllm.attention.torch_ref import dot_precision
from nanovllm.quant.awq import awq_gemm_ref, dequantize_awq
from nanovllm.utils.tuned import read_tuned, tuned_path

__all__ = ["awq_gemm", "awq_gemm_ref", "awq_dequantize", "dequantize_awq"]
DEQUANT_MIN_TOKENS = 128   # from this many tokens on, dequantize once and use cuBLAS (see awq_benchmark.md)


@triton.jit
def unpack_nibbles(words, BLOCK_N: tl.constexpr):
    """[R, BLOCK_N / 8] int32 -> [R, BLOCK_N] 4-bit values in natural column order."""
    words = tl.interleave(words, words)
    words = tl.interleave(words, words)
    words = tl.interleave(words, words)                         # each word repeated 8 times
    j = tl.arange(0, BLOCK_N) % 8
    return (words >> (4 * (4 * (j % 2) + j // 2))[None, :]) & 0xF


@triton.jit
def _awq_gemm_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, M, N, K,
                     stride_xm, stride_qk, stride_zk, stride_sk, stride_om,
                     GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)     # packed columns
    m_ok, n_ok, w_ok = offs_m < M, offs_n < N, offs_w < N // 8
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    for k0 in range(pid_k * k_per_split, tl.minimum((pid_k + 1) * k_per_split, K), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_ok[:, None], other=0.0)
        packed = tl.load(qweight_ptr + offs_k[:, None] * stride_qk + offs_w[None, :], mask=w_ok[None, :], other=0)
        group = k0 // GROUP_SIZE
        zeros = tl.load(qzeros_ptr + group * stride_zk + offs_w, mask=w_ok, other=0)[None, :]
        scales = tl.load(scales_ptr + group * stride_sk + offs_n, mask=n_ok, other=0.0)[None, :]
        q = unpack_nibbles(packed, BLOCK_N)                                   # [BLOCK_K, BLOCK_N]
        z = unpack_nibbles(zeros, BLOCK_N)                                    # [1, BLOCK_N]
        w = ((q - z).to(tl.float32) * scales.to(tl.float32)).to(x.dtype)
        acc += tl.dot(x, w, input_precision=DOT_PRECISION)
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(out, acc, mask=mask)


@triton.jit
def _awq_dequantize_kernel(qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, K, N, GROUP_SIZE: tl.constexpr,
                           BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = tl.program_id(1) * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    k_ok = (offs_k < K)[:, None]
    groups = (offs_k // GROUP_SIZE)[:, None]
    w_mask = k_ok & (offs_w < N // 8)[None, :]
    packed = tl.load(qweight_ptr + offs_k[:, None] * (N // 8) + offs_w[None, :], mask=w_mask, other=0)
    zeros = tl.load(qzeros_ptr + groups * (N // 8) + offs_w[None, :], mask=w_mask, other=0)
    mask = k_ok & (offs_n < N)[None, :]
    scales = tl.load(scales_ptr + groups * N + offs_n[None, :], mask=mask, other=0.0)
    w = (unpack_nibbles(packed, BLOCK_N) - unpack_nibbles(zeros, BLOCK_N)).to(tl.float32) * scales.to(tl.float32)
    tl.store(out_ptr + offs_k[:, None] * N + offs_n[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


def awq_dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """W [K, N] in `dtype` (the reference is `dequantize_awq`); for many tokens, W once + cuBLAS beats
    unpacking W inside every tile of a long GEMM."""
    K, N = qweight.shape[0], scales.shape[1]
    assert qweight.is_contiguous() and qzeros.is_contiguous() and scales.is_contiguous()
    out = torch.empty(K, N, dtype=dtype, device=qweight.device)
    grid = (triton.cdiv(K, 32), triton.cdiv(N, 256))
    _awq_dequantize_kernel[grid](qweight, qzeros, scales, out, K, N, GROUP_SIZE=group_size, BLOCK_K=32,
                                 BLOCK_N=256, num_warps=4)
    return out


@functools.cache
def num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8


AWQ_METHODS = ("fused", "gemv", "dequant")
TUNED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned")


def tuned_methods_path(gpu_name: str) -> str:
    return tuned_path(TUNED_DIR, "awq", gpu_name)


@functools.cache
def tuned_methods(gpu_name: str, k: int = 0, n: int = 0) -> list[tuple[int, str]]:
    """[(token count, fastest method)] that `tests/awq/bench_gemm.py --write` measured on this GPU model:
    for the layer shape [k, n] when it was measured (the winner differs per shape), else summed over the
    measured layers."""
    record = read_tuned(TUNED_DIR, "awq", gpu_name)
    if not record:
        return []
    fastest = record.get("fastest_by_shape", {}).get(f"{k}x{n}", record["fastest"])
    return sorted((int(tokens), method) for tokens, method in fastest.items())


def pick_method(num_tokens: int, table: list[tuple[int, str]]) -> str:
    """The measured winner at the nearest measured token count at or above num_tokens; without
    measurements (empty table), dequantize + cuBLAS from DEQUANT_MIN_TOKENS tokens on, else fused."""
    for tokens, method in table:
        if num_tokens <= tokens:
            return method
    if table:
        return table[-1][1]
    return "dequant" if num_tokens >= DEQUANT_MIN_TOKENS else "fused"


def awq_gemm(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
             group_size: int, split_k: int | None = None, method: str | None = None) -> torch.Tensor:
    """x [M, K] (bf16 or fp16) -> [M, N] in x's dtype. `method`: "fused" (tensor-core tiles, this file),
    "gemv" (triton_awq_gemv.py), "dequant" (dequantize + cuBLAS); None: `pick_method`."""
    M, K = x.shape
    assert method in (None, *AWQ_METHODS), method
    tiles_fit = group_size >= 16 and group_size == triton.next_power_of_2(group_size)   # K tile within a group
    if method is None:
        table = tuned_methods(torch.cuda.get_device_name(x.device), K, scales.shape[1]) if x.is_cuda else []
        method = pick_method(M, table) if tiles_fit else "dequant"
    if method == "dequant":
        return x @ awq_dequantize(qweight, qzeros, scales, group_size, x.dtype)
    if method == "gemv":
        from nanovllm.quant.triton_awq_gemv import awq_gemv
        return awq_gemv(x, qweight, qzeros, scales, group_size, split_k)
    N = scales.shape[1]
    assert qweight.shape == (K, N // 8) and qzeros.shape == (K // group_size, N // 8)
    assert qweight.dtype == qzeros.dtype == torch.int32 and x.stride(-1) == 1
    block_m = 16 if M <= 16 else (32 if M <= 32 else 64)
    block_n, block_k = 128, min(64, group_size)
    grid_mn = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    if split_k is None:      # few tokens: split K until there are ~4 programs per SM to hide memory latency
        split_k = 1 if M > 64 else max(1, min(triton.cdiv(4 * num_sms(x.device), grid_mn), K // (2 * block_k)))
    out = torch.zeros(M, N, dtype=torch.float32, device=x.device) if split_k > 1 else \
        torch.empty(M, N, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n), split_k)
    _awq_gemm_kernel[grid](x, qweight, qzeros, scales, out, M, N, K, x.stride(0), qweight.stride(0),
                           qzeros.stride(0), scales.stride(0), out.stride(0), GROUP_SIZE=group_size,
                           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
                           DOT_PRECISION=dot_precision(x.dtype),
                           num_warps=4, num_stages=3)
    return out.to(x.dtype) if split_k > 1 else out
