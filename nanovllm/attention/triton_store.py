"""Store kernel: write this step's K and V into the paged cache at `slot_mapping`, quantizing if asked.

k, v: [num_tokens, num_kv_heads, head_dim], each token's heads contiguous (they may be strided views of the
fused qkv output). Cache values: [num_blocks, block_size, num_kv_heads, head_dim], contiguous, so slot s
starts at element s * num_kv_heads * head_dim; except a quantized V, transposed within its blocks
([num_blocks, num_kv_heads, head_dim, block_size], see quant/kv.py), where a token's values lie block_size
apart. INT8/FP8 caches also hold a float32 scale per slot and head at s * num_kv_heads + h. One program
per token handles all its heads: per head scale = max|x| / QMAX, q = round(x / scale) (int8, half away
from zero) or fp8(x / scale), NaN written as 0 so that the cache never holds NaN bytes.
Slot -1 (padding in a CUDA graph batch) is skipped. Reference: `store_kv_ref`.
"""
import torch
import triton
import triton.language as tl

from nanovllm.attention.torch_ref import kv_cache_kind, store_kv_ref
from nanovllm.quant.kv import MIN_SCALE, QMAX, LayerKVCache

__all__ = ["store_kv", "store_kv_ref"]
QUANT_CODES = {"auto": 0, "int8": 1, "fp8": 2}


@triton.jit
def _store_one(src_ptr, dst_ptr, scale_ptr, slot, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_H: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
               BLOCK_SIZE: tl.constexpr, TRANSPOSED: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs = heads[:, None] * HEAD_DIM + offs_d[None, :]
    mask = heads[:, None] < NUM_KV_HEADS
    x = tl.load(src_ptr + offs, mask=mask, other=0.0)
    if TRANSPOSED:   # [num_blocks, num_kv_heads, head_dim, block_size]
        dst = dst_ptr + (slot // BLOCK_SIZE) * (NUM_KV_HEADS * HEAD_DIM * BLOCK_SIZE) + slot % BLOCK_SIZE \
            + heads[:, None] * (HEAD_DIM * BLOCK_SIZE) + offs_d[None, :] * BLOCK_SIZE
    else:
        dst = dst_ptr + slot * (NUM_KV_HEADS * HEAD_DIM) + offs
    if QUANT == 0:
        tl.store(dst, x.to(dst_ptr.dtype.element_ty), mask=mask)
    else:
        x = x.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=1) / QMAX, MIN_SCALE)        # [BLOCK_H]
        y = x / scale[:, None]
        if QUANT == 1:
            y = tl.where(y >= 0, tl.floor(y + 0.5), -tl.floor(-y + 0.5))
        # no NaN bytes, nothing out of range (the kernels read V past a sequence's end unmasked)
        y = tl.minimum(tl.maximum(tl.where(y == y, y, 0.0), -QMAX), QMAX)
        tl.store(dst, y.to(dst_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + slot * NUM_KV_HEADS + heads, scale, mask=heads < NUM_KV_HEADS)


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, stride_k, stride_v,
                     NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                     QUANT: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        _store_one(k_ptr + token * stride_k, k_cache_ptr, k_scale_ptr, slot, NUM_KV_HEADS, HEAD_DIM, BLOCK_H,
                   QUANT, QMAX, MIN_SCALE, BLOCK_SIZE, False)
        _store_one(v_ptr + token * stride_v, v_cache_ptr, v_scale_ptr, slot, NUM_KV_HEADS, HEAD_DIM, BLOCK_H,
                   QUANT, QMAX, MIN_SCALE, BLOCK_SIZE, QUANT != 0)   # a quantized V is transposed


def store_kv(k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache, slot_mapping: torch.Tensor) -> None:
    num_tokens, num_kv_heads, head_dim = k.shape
    assert v.shape == k.shape and slot_mapping.shape == (num_tokens,)
    assert k.stride(-1) == 1 and k.stride(-2) == head_dim and v.stride(-1) == 1 and v.stride(-2) == head_dim
    assert cache.k.is_contiguous() and cache.v.is_contiguous() and cache.k.shape[2:] == (num_kv_heads, head_dim)
    assert cache.v_slots.shape == cache.k.shape
    assert head_dim == triton.next_power_of_2(head_dim), "head_dim must be a power of 2"
    kind = kv_cache_kind(cache)
    k_scale = cache.k_scale if cache.quantized else cache.k      # unused pointers when not quantized
    v_scale = cache.v_scale if cache.quantized else cache.v
    _store_kv_kernel[(num_tokens,)](k, v, cache.k, cache.v, k_scale, v_scale, slot_mapping, k.stride(0), v.stride(0),
                                    NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
                                    BLOCK_H=triton.next_power_of_2(num_kv_heads), QUANT=QUANT_CODES[kind],
                                    QMAX=QMAX.get(kind, 1.0), MIN_SCALE=MIN_SCALE, BLOCK_SIZE=cache.k.shape[1])
