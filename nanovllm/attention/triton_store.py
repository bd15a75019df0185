"""Store kernel: write this step's K and V into the paged cache at `slot_mapping`, quantizing if asked.

k, v: [num_tokens, num_kv_heads, head_dim], each token's heads contiguous (they may be strided views of the
fused qkv output). Cache values: [num_blocks, block_size, num_kv_heads, head_dim], contiguous, so slot s
starts at element s * num_kv_heads * head_dim; except a quantized V, stored in groups of G keys
([num_blocks, num_kv_heads, block_size // G, head_dim, G], see quant/kv.py), where a token's values lie G
apart. INT8/FP8 caches also hold a float32 scale per slot and head, head-major within each block
([num_blocks, num_kv_heads, block_size]). One program
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
               BLOCK_SIZE: tl.constexpr, KEY_GROUP: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs = heads[:, None] * HEAD_DIM + offs_d[None, :]
    mask = heads[:, None] < NUM_KV_HEADS
    x = tl.load(src_ptr + offs, mask=mask, other=0.0)
    block, row = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    if KEY_GROUP > 0:   # [num_blocks, num_kv_heads, BLOCK_SIZE // KEY_GROUP, head_dim, KEY_GROUP]
        dst = dst_ptr + block * (NUM_KV_HEADS * HEAD_DIM * BLOCK_SIZE) \
            + (row // KEY_GROUP) * (HEAD_DIM * KEY_GROUP) + row % KEY_GROUP \
            + heads[:, None] * (HEAD_DIM * BLOCK_SIZE) + offs_d[None, :] * KEY_GROUP
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
        # head-major scales: [num_blocks, NUM_KV_HEADS, BLOCK_SIZE]
        tl.store(scale_ptr + block * (NUM_KV_HEADS * BLOCK_SIZE) + heads * BLOCK_SIZE + row, scale,
                 mask=heads < NUM_KV_HEADS)


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, stride_k, stride_v,
                     NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                     QUANT: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     V_GROUP: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        _store_one(k_ptr + token * stride_k, k_cache_ptr, k_scale_ptr, slot, NUM_KV_HEADS, HEAD_DIM, BLOCK_H,
                   QUANT, QMAX, MIN_SCALE, BLOCK_SIZE, 0)
        _store_one(v_ptr + token * stride_v, v_cache_ptr, v_scale_ptr, slot, NUM_KV_HEADS, HEAD_DIM, BLOCK_H,
                   QUANT, QMAX, MIN_SCALE, BLOCK_SIZE, V_GROUP)


def store_kv(k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache, slot_mapping: torch.Tensor) -> None:
    num_tokens, num_kv_heads, head_dim = k.shape
    assert v.shape == k.shape and slot_mapping.shape == (num_tokens,)
    assert k.stride(-1) == 1 and k.stride(-2) == head_dim and v.stride(-1) == 1 and v.stride(-2) == head_dim
    assert cache.k.shape[2:] == (num_kv_heads, head_dim)
    cache.check_storage()
    assert head_dim == triton.next_power_of_2(head_dim), "head_dim must be a power of 2"
    kind = kv_cache_kind(cache)
    k_scale = cache.k_scale if cache.quantized else cache.k      # unused pointers when not quantized
    v_scale = cache.v_scale if cache.quantized else cache.v
    _store_kv_kernel[(num_tokens,)](k, v, cache.k, cache.v, k_scale, v_scale, slot_mapping, k.stride(0), v.stride(0),
                                    NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
                                    BLOCK_H=triton.next_power_of_2(num_kv_heads), QUANT=QUANT_CODES[kind],
                                    QMAX=QMAX.get(kind, 1.0), MIN_SCALE=MIN_SCALE, BLOCK_SIZE=cache.k.shape[1],
                                    V_GROUP=cache.v_group)
