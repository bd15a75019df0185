"""Store kernel: write this step's K and V into the paged cache at `slot_mapping`, quantizing if asked.

k, v: [num_tokens, num_kv_heads, head_dim], each token's heads contiguous (they may be strided views of the
fused qkv output). Cache values: [num_blocks, block_size, num_kv_heads, head_dim], contiguous, so slot s
starts at element s * num_kv_heads * head_dim; except a quantized V, stored in groups of G keys
([num_blocks, num_kv_heads, block_size // G, head_dim, G], see quant/kv.py), where a token's values lie G
apart. INT8/FP8 caches also hold a float32 scale per slot and head, head-major within each block
([num_blocks, num_kv_heads, block_size]). Per token and head: scale = max|x| / QMAX, q = round(x / scale)
(int8, half away from zero) or fp8(x / scale), NaN written as 0 so that the cache never holds NaN bytes.
A decode step's tokens get one program each, as do a bf16 cache's. A prefill's tokens into an INT8/FP8 cache
go RUN_TOKENS to a program: when they go to consecutive slots in one block and V group (a prompt's do,
unless the run straddles two prompts or a group boundary) the program writes them as one run, so a quantized
V's bytes of neighbouring tokens are stored side by side instead of G apart each; otherwise it writes them
one by one.
Slot -1 (padding in a CUDA graph batch) is skipped. Reference: `store_kv_ref`.
"""
import torch
import triton
import triton.language as tl

from nanovllm.attention.torch_ref import kv_cache_kind, store_kv_ref
from nanovllm.quant.kv import MIN_SCALE, QMAX, LayerKVCache

__all__ = ["store_kv", "store_kv_ref"]
QUANT_CODES = {"auto": 0, "int8": 1, "fp8": 2}
RUN_TOKENS = 16          # tokens per program when a step writes prompts (8 warps: 4 would spill registers)
RUN_MIN_TOKENS = 1024


@triton.jit
def _store_run(src_ptr, stride_src, dst_ptr, scale_ptr, slot0, RUN: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr,
               MIN_SCALE: tl.constexpr, BLOCK_SIZE: tl.constexpr, KEY_GROUP: tl.constexpr):
    """RUN tokens, rows stride_src apart from src_ptr, into the consecutive slots slot0 .. slot0 + RUN - 1,
    which lie in one cache block (and, for a grouped V, in one group of KEY_GROUP keys)."""
    tokens, head_ids = tl.arange(0, RUN), tl.arange(0, BLOCK_H)
    t, heads, offs_d = tokens[:, None, None], head_ids[None, :, None], tl.arange(0, HEAD_DIM)[None, None, :]
    mask = heads < NUM_KV_HEADS
    x = tl.load(src_ptr + t * stride_src + heads * HEAD_DIM + offs_d, mask=mask, other=0.0)
    block, row0 = slot0 // BLOCK_SIZE, slot0 % BLOCK_SIZE
    if KEY_GROUP > 0:   # [num_blocks, num_kv_heads, BLOCK_SIZE // KEY_GROUP, head_dim, KEY_GROUP]
        # the run's tokens are side by side for each head and dimension
        dst = dst_ptr + block * (NUM_KV_HEADS * HEAD_DIM * BLOCK_SIZE) \
            + (row0 // KEY_GROUP) * (HEAD_DIM * KEY_GROUP) + row0 % KEY_GROUP + t \
            + heads * (HEAD_DIM * BLOCK_SIZE) + offs_d * KEY_GROUP
    else:
        dst = dst_ptr + (slot0 + t) * (NUM_KV_HEADS * HEAD_DIM) + heads * HEAD_DIM + offs_d
    if QUANT == 0:
        tl.store(dst, x.to(dst_ptr.dtype.element_ty), mask=mask)
    else:
        x = x.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=2) / QMAX, MIN_SCALE)        # [RUN, BLOCK_H]
        y = x / scale[:, :, None]
        if QUANT == 1:
            y = tl.where(y >= 0, tl.floor(y + 0.5), -tl.floor(-y + 0.5))
        # no NaN bytes, nothing out of range (the kernels read V past a sequence's end unmasked)
        y = tl.minimum(tl.maximum(tl.where(y == y, y, 0.0), -QMAX), QMAX)
        tl.store(dst, y.to(dst_ptr.dtype.element_ty), mask=mask)
        # head-major scales: [num_blocks, NUM_KV_HEADS, BLOCK_SIZE]
        tl.store(scale_ptr + block * (NUM_KV_HEADS * BLOCK_SIZE) + head_ids[None, :] * BLOCK_SIZE + row0
                 + tokens[:, None], scale, mask=head_ids[None, :] < NUM_KV_HEADS)


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, num_tokens,
                     stride_k, stride_v, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                     QUANT: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     V_GROUP: tl.constexpr, BLOCK_T: tl.constexpr):
    first = tl.program_id(0) * BLOCK_T
    # A run: the program's tokens go to consecutive slots inside one block and one V group (a prompt's tokens
    # do); then a warp's byte stores of a grouped V cover several tokens side by side. One token is a run
    # unless it is padding.
    t = tl.arange(0, BLOCK_T)
    slots = tl.load(slot_ptr + first + t, mask=first + t < num_tokens, other=-1).to(tl.int64)
    slot0 = tl.load(slot_ptr + first).to(tl.int64)
    span = V_GROUP if V_GROUP > 0 else BLOCK_SIZE
    if (slot0 >= 0) & (slot0 % span + BLOCK_T <= span) & (tl.sum((slots != slot0 + t).to(tl.int32)) == 0):
        _store_run(k_ptr + first * stride_k, stride_k, k_cache_ptr, k_scale_ptr, slot0, BLOCK_T, NUM_KV_HEADS,
                   HEAD_DIM, BLOCK_H, QUANT, QMAX, MIN_SCALE, BLOCK_SIZE, 0)
        _store_run(v_ptr + first * stride_v, stride_v, v_cache_ptr, v_scale_ptr, slot0, BLOCK_T, NUM_KV_HEADS,
                   HEAD_DIM, BLOCK_H, QUANT, QMAX, MIN_SCALE, BLOCK_SIZE, V_GROUP)
    else:   # token by token
        for i in range(BLOCK_T):
            token = first + i
            slot = tl.load(slot_ptr + token, mask=token < num_tokens, other=-1).to(tl.int64)
            if slot >= 0:
                _store_run(k_ptr + token * stride_k, stride_k, k_cache_ptr, k_scale_ptr, slot, 1, NUM_KV_HEADS,
                           HEAD_DIM, BLOCK_H, QUANT, QMAX, MIN_SCALE, BLOCK_SIZE, 0)
                _store_run(v_ptr + token * stride_v, stride_v, v_cache_ptr, v_scale_ptr, slot, 1, NUM_KV_HEADS,
                           HEAD_DIM, BLOCK_H, QUANT, QMAX, MIN_SCALE, BLOCK_SIZE, V_GROUP)


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
    # runs of tokens are for prompts (thousands of tokens in a step) into a quantized cache: a decode step's
    # tokens belong to different sequences, and a bf16 prompt step measured faster token by token (41 us
    # against 49 for 16,000 tokens on the H200, tests/kv_quant/bench_store.py)
    block_t = RUN_TOKENS if cache.quantized and num_tokens >= RUN_MIN_TOKENS else 1
    _store_kv_kernel[(triton.cdiv(num_tokens, block_t),)](
        k, v, cache.k, cache.v, k_scale, v_scale, slot_mapping, num_tokens, k.stride(0), v.stride(0),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(num_kv_heads),
        QUANT=QUANT_CODES[kind], QMAX=QMAX.get(kind, 1.0), MIN_SCALE=MIN_SCALE, BLOCK_SIZE=cache.k.shape[1],
        V_GROUP=cache.v_group, BLOCK_T=block_t, num_warps=8 if block_t > 1 else 4)
