"""AWQ GEMV in Triton for a few tokens (decode): the 4-bit weight streams through registers into FMAs.

With one token the matmul is a matrix-vector product, bound by the bytes of the weight. Each program
owns BLOCK_N output columns and a slice of the K groups (split-K, so even one token puts a few programs
on every SM). Per group it loads the [R, BLOCK_N] words of the kernel layout (awq.py; R = group / 8) and
for each nibble i multiplies 128 + q (a float made by OR-ing q into 128.0's mantissa, triton_awq.py)
by the token's inputs x[g * group + i * R + r]: shift, mask-or and FMA per weight, nothing else. Per
group and column, the scale and zero point are applied to the running sums:
    y[n] = sum_g s[g, n] * (sum_{k in g} x[k] (128 + q[k, n]) - (128 + z[g, n]) * sum_{k in g} x[k])
The words, scales and zeros of a group are loaded two groups ahead of their use, so that each program
keeps three groups of loads in flight instead of waiting for one (the compiler issues a load where the
source asks for it or later, never earlier).
Split-K without extra kernels: each program writes its partial sums to a float32 workspace and bumps its
tile's counter; the program that arrives last adds the partials in split order (so the result does not
depend on timing), writes y in x's dtype and resets the counter for the next call.
For one token of group 128 on a GPU, `awq_gemv` hands over to gluon_awq_gemv.py: the same math with the
thread layout written out (8 columns per thread), faster where it runs; this kernel runs the rest and
everything under the CPU interpreter.
Reference: `awq_gemm_ref` (dequantize, then matmul).
"""
import functools

import torch
import triton
import triton.language as tl

from nanovllm.quant.awq_common import (
    MAGIC_BITS,
    MAX_TILES,
    TUNED_DIR,
    finish_split_k,
    magic_nibble,
    measured_at,
    split_k_buffers,
    split_k_for,
)
from nanovllm.quant.gluon_awq_gemv import gluon_awq_gemv, gluon_supported
from nanovllm.utils.tuned import device_name, read_tuned

__all__ = ["awq_gemv"]


@triton.jit
def load_group(w_rows, scales_ptr, zeros_ptr, g, end, N, offs_n, ROWS: tl.constexpr):
    """Group g's words [1, ROWS, BLOCK_N], scales and zeros [BLOCK_N]; zeros past the split's last group."""
    ok = offs_n < tl.where(g < end, N, 0)
    return (tl.load(w_rows + g * ROWS * N, mask=ok[None, None, :], other=0),
            tl.load(scales_ptr + g * N + offs_n, mask=ok, other=0.0),
            tl.load(zeros_ptr + g * N + offs_n, mask=ok, other=0.0))


@triton.jit
def _awq_gemv_kernel(x_ptr, qweight_ptr, zeros_ptr, scales_ptr, out_ptr, partial_ptr, count_ptr, M, N, K,
                     stride_xm, stride_om, magic, split_k, GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    ROWS: tl.constexpr = GROUP_SIZE // 8
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, ROWS)
    m_ok, n_ok = offs_m < M, offs_n < N
    x_rows = x_ptr + offs_m[:, None, None] * stride_xm + offs_r[None, :, None]           # [BLOCK_M, ROWS, 1]
    w_rows = qweight_ptr + offs_r[None, :, None] * N + offs_n[None, None, :]          # [1, ROWS, BLOCK_N]
    per_split = tl.cdiv(K // GROUP_SIZE, split_k)
    start = pid_k * per_split
    end = tl.minimum(start + per_split, K // GROUP_SIZE)
    words, s, z = load_group(w_rows, scales_ptr, zeros_ptr, start, end, N, offs_n, ROWS)
    words_1, s_1, z_1 = load_group(w_rows, scales_ptr, zeros_ptr, start + 1, end, N, offs_n, ROWS)
    acc = tl.zeros([BLOCK_M, ROWS, BLOCK_N], tl.float32)
    for g in range(start, end):
        words_2, s_2, z_2 = load_group(w_rows, scales_ptr, zeros_ptr, g + 2, end, N, offs_n, ROWS)
        part = tl.zeros([BLOCK_M, ROWS, BLOCK_N], tl.float32)
        x_sum = tl.zeros([BLOCK_M, ROWS, 1], tl.float32)
        for i in tl.static_range(8):
            x = tl.load(x_rows + g * GROUP_SIZE + i * ROWS, mask=m_ok[:, None, None], other=0.0).to(tl.float32)
            part += x * magic_nibble(words, i, magic)
            x_sum += x
        scale, zero = s.to(tl.float32)[None, None, :], z.to(tl.float32)[None, None, :]
        acc += part * scale - x_sum * (scale * (128.0 + zero))
        words, s, z, words_1, s_1, z_1 = words_1, s_1, z_1, words_2, s_2, z_2
    y = tl.sum(acc, axis=1)                                                        # [BLOCK_M, BLOCK_N]
    tile = offs_m[:, None] * N + offs_n[None, :]
    finish_split_k(y, out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], partial_ptr + tile, M * N,
                   count_ptr + pid_n, m_ok[:, None] & n_ok[None, :], pid_k, split_k)


@functools.cache
def tuned_settings(gpu_name: str, k: int, n: int) -> list[tuple[int, list[int]]]:
    """[(tokens, [block_n, split_k, num_warps])] that benchmarks/bench_gemm.py --sweep-gemv --write measured
    fastest for the layer shape [k, n] on this GPU model; [] if it was not measured."""
    record = read_tuned(TUNED_DIR, "awq", gpu_name).get("gemv_by_shape", {}).get(f"{k}x{n}", {})
    return sorted((int(tokens), settings) for tokens, settings in record.items())


def default_settings(M: int, N: int, K: int, group_size: int, device: torch.device) -> tuple[int, int, int]:
    """(block_n, split_k, num_warps): measured for this shape (`measured_at` the token count), else what
    won most sweeps: 64 columns, 4 warps, and split-K up to ~4 programs per SM for one token,
    fewer as tokens add FMAs (4 / M), at most one group per split (longer programs keep their prefetch busy)."""
    table = tuned_settings(device_name(device), K, N) if device.type == "cuda" else []
    measured = measured_at(M, table)
    if measured:
        return tuple(measured)
    block_n = 64
    per_sm = max(1, 4 // M)
    split_k = split_k_for(per_sm, triton.cdiv(N, block_n), K // group_size, device)
    return block_n, split_k, 4


def awq_gemv(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int,
             block_n: int | None = None, split_k: int | None = None, num_warps: int | None = None,
             kernel: str | None = None) -> torch.Tensor:
    """x [M, K] with M <= 8 tokens -> [M, N] in x's dtype; weights in the kernel layout of awq.py.
    kernel: "gluon" for one 16-bit token where Gluon runs (gluon_awq_gemv.py: the same math, ~15% faster on the
    H200), "triton" (this file's kernel, whose settings block_n and num_warps are); None: gluon if it can."""
    assert kernel in (None, "gluon", "triton")
    if kernel != "triton" and gluon_supported(x, group_size):
        return gluon_awq_gemv(x, qweight, zeros, scales, split_k)
    assert kernel != "gluon", "the Gluon GEMV runs one token of group 128 on a GPU whose Triton has Gluon"
    M, K = x.shape
    N = scales.shape[1]
    assert M <= 8 and x.stride(-1) == 1 and zeros.is_contiguous() and scales.is_contiguous()
    defaults = default_settings(M, N, K, group_size, x.device)
    block_n, split_k, num_warps = (v or d for v, d in zip((block_n, split_k, num_warps), defaults))
    assert triton.cdiv(N, block_n) <= MAX_TILES
    out, partial, counters = split_k_buffers(M, N, split_k, x)
    grid = (triton.cdiv(N, block_n), split_k)
    _awq_gemv_kernel[grid](x, qweight, zeros, scales, out, partial, counters, M, N, K, x.stride(0),
                           out.stride(0), MAGIC_BITS, split_k, GROUP_SIZE=group_size,
                           BLOCK_M=triton.next_power_of_2(M), BLOCK_N=block_n, num_warps=num_warps)
    return out
