"""Fused norm kernels for the GPU: residual add + RMSNorm, and Qwen3's per-head q/k RMSNorm + RoPE.

Decode runs ~10 small elementwise ops per layer on a few hundred tokens; each costs a few microseconds
of launch and memory latency whatever its size, so fewer kernels is faster.

add_rms_norm: one program per row of [num_tokens, hidden]:
    s = x + residual (rounded to the model dtype, as PyTorch does);  y = w * (s * rsqrt(mean(s^2) + eps))
qk_norm_rope: one program per token and per tensor (q or k) holds all its heads as a
[BLOCK_H, head_dim / 2] tile per half, so the rotation pairs (x1, x2) never need a shuffle:
    n = w * (x * rsqrt(mean(x^2) + eps));  out = (n1 cos - n2 sin, n2 cos + n1 sin)
with cos/sin read from the rotary cache row at the token's position. Without norm weights (Llama, Qwen2,
Mistral: no qk-norm) n = x, the rotation alone, in the same single launch. Roundings follow the references
(`add_rms_norm_ref` in layernorm.py, `qk_norm_rope_ref` and `apply_rotary_ref` in rotary_embedding.py) step
by step, so results agree to the last bit in most elements.
"""
import torch
import triton
import triton.language as tl

from nanovllm.utils.pdl import pdl_launch, wait_then_release

__all__ = ["add_rms_norm", "qk_norm_rope"]


@triton.jit
def _add_rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, sum_ptr, stride_x, stride_r, N, eps,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_then_release(PDL)        # the projection after the norm may start loading its weights (utils/pdl.py)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = (x + tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * N + offs, x, mask=mask)
    xf = x.to(tl.float32)
    normed = (xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * N + offs, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """norm(x) or (norm(x + residual), x + residual); x, residual [num_tokens, hidden], rows contiguous."""
    num_tokens, hidden = x.shape
    assert x.stride(-1) == 1 and weight.shape == (hidden,) and weight.dtype == x.dtype
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    summed = out if residual is None else torch.empty_like(out)
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(-1) == 1
    _add_rms_norm_kernel[(num_tokens,)](x, x if residual is None else residual, weight, out, summed, x.stride(0),
                                        0 if residual is None else residual.stride(0), hidden, eps,
                                        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden),
                                        **pdl_launch(x.device),
                                        num_warps=4 if hidden <= 4096 else 8)
    return out if residual is None else (out, summed)


@triton.jit
def _norm_rope_heads(src_ptr, dst_ptr, weight_ptr, cos, sin, num_heads, eps, HALF: tl.constexpr,
                     BLOCK_H: tl.constexpr, NORM: tl.constexpr):
    """RMSNorm (if NORM) then rotate each of num_heads head vectors at src_ptr (head h at h * 2 * HALF)."""
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, HALF)[None, :]
    mask = heads < num_heads
    x1 = tl.load(src_ptr + heads * 2 * HALF + cols, mask=mask, other=0.0)             # [BLOCK_H, HALF]
    x2 = tl.load(src_ptr + heads * 2 * HALF + HALF + cols, mask=mask, other=0.0)
    dtype = x1.dtype
    n1, n2 = x1.to(tl.float32), x2.to(tl.float32)
    if NORM:
        r = tl.rsqrt((tl.sum(n1 * n1, axis=1) + tl.sum(n2 * n2, axis=1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(weight_ptr + cols)
        w2 = tl.load(weight_ptr + HALF + cols)
        n1 = (w1 * (n1 * r).to(dtype)).to(dtype).to(tl.float32)
        n2 = (w2 * (n2 * r).to(dtype)).to(dtype).to(tl.float32)
    tl.store(dst_ptr + heads * 2 * HALF + cols, (n1 * cos - n2 * sin).to(dtype), mask=mask)
    tl.store(dst_ptr + heads * 2 * HALF + HALF + cols, (n2 * cos + n1 * sin).to(dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, q_weight_ptr, k_weight_ptr, positions_ptr,
                         cos_sin_ptr, stride_q, stride_k, num_q_heads, num_kv_heads, eps,
                         HALF: tl.constexpr, BLOCK_H: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr):
    wait_then_release(PDL)        # after the qkv projection (utils/pdl.py)
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    cols = tl.arange(0, HALF)[None, :]
    cos = tl.load(cos_sin_ptr + pos * 2 * HALF + cols)                               # [1, HALF] float32
    sin = tl.load(cos_sin_ptr + pos * 2 * HALF + HALF + cols)
    if tl.program_id(1) == 0:
        _norm_rope_heads(q_ptr + token * stride_q, q_out_ptr + token * num_q_heads * 2 * HALF, q_weight_ptr,
                         cos, sin, num_q_heads, eps, HALF, BLOCK_H, NORM)
    else:
        _norm_rope_heads(k_ptr + token * stride_k, k_out_ptr + token * num_kv_heads * 2 * HALF, k_weight_ptr,
                         cos, sin, num_kv_heads, eps, HALF, BLOCK_H, NORM)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, q_weight: torch.Tensor | None,
                 k_weight: torch.Tensor | None, eps: float,
                 cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [num_tokens, num_heads, head_dim], k [num_tokens, num_kv_heads, head_dim] (views of the fused qkv
    output are fine: heads contiguous within a token) -> new contiguous q, k. Without weights (None) no
    norm: the rotation alone."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert k.shape == (num_tokens, num_kv_heads, head_dim) and positions.shape == (num_tokens,)
    for t in (q, k):
        assert t.stride(-1) == 1 and t.stride(-2) == head_dim
    assert head_dim == triton.next_power_of_2(head_dim), "head_dim must be a power of 2"
    assert cos_sin_cache.dtype == torch.float32 and cos_sin_cache.shape[1] == head_dim
    q_out, k_out = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(k.shape, dtype=k.dtype,
                                                                                      device=k.device)
    norm = q_weight is not None
    _qk_norm_rope_kernel[(num_tokens, 2)](q, k, q_out, k_out, q_weight if norm else q, k_weight if norm else k,
                                          positions, cos_sin_cache, q.stride(0), k.stride(0), num_heads,
                                          num_kv_heads, eps, HALF=head_dim // 2,
                                          BLOCK_H=triton.next_power_of_2(num_heads), NORM=norm,
                                          **pdl_launch(q.device), num_warps=4)
    return q_out, k_out
