"""AWQ GEMV in Triton for a few tokens: the 4-bit weights never leave registers, no tensor-core tile.

With one token the matmul is a matrix-vector product: memory-bound, and the tensor-core path of
triton_awq.py pays for padding the token to 16 rows and for a round trip of every dequantized tile through
shared memory. Here each program owns BLOCK_N output columns, one token and a slice of the K groups, and
uses the group structure to keep the inner loop at shift, mask, convert and FMA per weight:
    y[n] = sum_g s[g, n] * (sum_{k in g} q[k, n] x[k]  -  z[g, n] * sum_{k in g} x[k])
Partial sums of the K slices are added atomically into a float32 buffer (split-K), so even a single token
puts ~4 programs on every SM. Reference: `awq_gemm_ref` (dequantize, then matmul).
"""
import torch
import triton
import triton.language as tl

from nanovllm.quant.awq import awq_gemm_ref
from nanovllm.quant.triton_awq import num_sms, unpack_nibbles

__all__ = ["awq_gemv", "awq_gemm_ref"]


@triton.jit
def _awq_gemv_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, N, K, stride_xm, stride_om,
                     GROUP_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n, pid_k, token = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    n_ok, w_ok = offs_n < N, offs_w < N // 8
    num_groups = K // GROUP_SIZE
    groups_per_split = tl.cdiv(num_groups, tl.num_programs(1))
    acc = tl.zeros([BLOCK_N], tl.float32)
    for g in range(pid_k * groups_per_split, tl.minimum((pid_k + 1) * groups_per_split, num_groups)):
        qx = tl.zeros([BLOCK_N], tl.float32)           # sum_k q[k, n] x[k] over the group
        x_sum = 0.0
        for k0 in range(g * GROUP_SIZE, (g + 1) * GROUP_SIZE, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + token * stride_xm + offs_k).to(tl.float32)                    # [BLOCK_K]
            packed = tl.load(qweight_ptr + offs_k[:, None] * (N // 8) + offs_w[None, :], mask=w_ok[None, :],
                             other=0)
            qx += tl.sum(unpack_nibbles(packed, BLOCK_N).to(tl.float32) * x[:, None], axis=0)
            x_sum += tl.sum(x, axis=0)
        zeros = tl.load(qzeros_ptr + g * (N // 8) + offs_w, mask=w_ok, other=0)[None, :]
        z = tl.sum(unpack_nibbles(zeros, BLOCK_N), axis=0).to(tl.float32)                             # [BLOCK_N]
        s = tl.load(scales_ptr + g * N + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        acc += s * (qx - z * x_sum)
    tl.atomic_add(out_ptr + token * stride_om + offs_n, acc, mask=n_ok)


def awq_gemv(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
             group_size: int, split_k: int | None = None) -> torch.Tensor:
    """x [M, K] with M a few tokens (each re-reads the weight) -> [M, N] in x's dtype."""
    M, K = x.shape
    N = scales.shape[1]
    assert qweight.shape == (K, N // 8) and qzeros.shape == (K // group_size, N // 8)
    assert qweight.is_contiguous() and qzeros.is_contiguous() and scales.is_contiguous() and x.stride(-1) == 1
    block_n, block_k = 128, min(32, group_size)
    assert group_size % block_k == 0 and block_k == triton.next_power_of_2(block_k), \
        "group_size must be a power of 2 or a multiple of 32"
    num_n = triton.cdiv(N, block_n)
    if split_k is None:
        split_k = max(1, min(triton.cdiv(4 * num_sms(x.device), num_n * M), K // group_size))
    out = torch.zeros(M, N, dtype=torch.float32, device=x.device)
    _awq_gemv_kernel[(num_n, split_k, M)](x, qweight, qzeros, scales, out, N, K, x.stride(0), out.stride(0),
                                         GROUP_SIZE=group_size, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)
    return out.to(x.dtype)
