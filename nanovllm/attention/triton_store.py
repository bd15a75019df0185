"""Store kernels: write this step's K and V into the paged cache, quantizing if asked.

k, v: [num_tokens, num_kv_heads, head_dim], each token's heads contiguous (they may be strided views of the
fused qkv output). Cache values: [num_blocks, block_size, num_kv_heads, head_dim], contiguous, so slot s
starts at element s * num_kv_heads * head_dim; except a quantized V, stored in groups of G keys
([num_blocks, num_kv_heads, block_size // G, head_dim, G], see quant/kv.py), where a token's values lie G
apart. INT8/FP8 caches also hold a float32 scale per slot and head, head-major within each block
([num_blocks, num_kv_heads, block_size]). Per token and head: scale = max|x| / QMAX, q = round(x / scale)
(int8, half away from zero) or fp8(x / scale), NaN written as 0 so that the cache never holds NaN bytes.

Two kernels, one per kind of step:
- Decode (`store_kv`): one program per token, at slot_mapping (slot -1, padding in a CUDA graph batch, is
  skipped). A decode step's tokens belong to different sequences, so there is nothing to group.
- Prefill (`store_prompt_kv`): one program per window of W consecutive positions of one sequence and one KV
  head, windows aligned to multiples of W (W = G for a quantized cache, 64 or the largest power of 2
  dividing block_size otherwise), so a window lies in one block and, for a quantized V, fills one group:
  its V bytes are one contiguous [head_dim, W] tile and its scales one run, both written with 16-byte
  stores. The positions come from the attention metadata (a sequence's new tokens are the last ones of its
  context), not from slot_mapping; a window's positions outside this step's tokens (a prefix-cache hit, an
  earlier chunk) are left as they are.
Reference: `store_kv_ref` (with the step's slot_mapping for either kernel).
"""
import torch
import triton
import triton.language as tl

from nanovllm.attention.metadata import AttentionMetadata
from nanovllm.attention.torch_ref import kv_cache_kind, store_kv_ref
from nanovllm.quant.kv import MIN_SCALE, QMAX, LayerKVCache, v_key_group
from nanovllm.utils.pdl import pdl_launch, wait_then_release

__all__ = ["store_kv", "store_prompt_kv", "store_step_kv", "store_kv_ref"]
QUANT_CODES = {"auto": 0, "int8": 1, "fp8": 2}


@triton.jit
def _store_rows(src, dst, scale_dst, mask, QUANT: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
                MASKED: tl.constexpr):
    """Rows of head_dim values from the pointers src to dst (both [rows, head_dim]); quantized per row with
    the scales written at scale_dst ([rows, 1]) when QUANT. mask [rows, 1]: the rows to write (MASKED)."""
    if MASKED:
        x = tl.load(src, mask=mask, other=0.0)
    else:
        x = tl.load(src)
    if QUANT == 0:
        y = x
    else:
        x = x.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=1) / QMAX, MIN_SCALE)[:, None]      # [rows, 1]
        y = x / scale
        if QUANT == 1:
            y = tl.where(y >= 0, tl.floor(y + 0.5), -tl.floor(-y + 0.5))
        # no NaN bytes, nothing out of range (the kernels read V past a sequence's end unmasked)
        y = tl.minimum(tl.maximum(tl.where(y == y, y, 0.0), -QMAX), QMAX)
        if MASKED:
            tl.store(scale_dst, scale, mask=mask)
        else:
            tl.store(scale_dst, scale)
    if MASKED:
        tl.store(dst, y.to(dst.dtype.element_ty), mask=mask)
    else:
        tl.store(dst, y.to(dst.dtype.element_ty))


@triton.jit
def _store_token_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr, stride_k,
                        stride_v, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                        QUANT: tl.constexpr, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
                        BLOCK_SIZE: tl.constexpr, V_GROUP: tl.constexpr, PDL: tl.constexpr):
    wait_then_release(PDL)        # after the RoPE kernel (utils/pdl.py)
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        heads, offs_d = tl.arange(0, BLOCK_H)[:, None], tl.arange(0, HEAD_DIM)[None, :]
        block, row = slot // BLOCK_SIZE, slot % BLOCK_SIZE
        k_dst = k_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM) + heads * HEAD_DIM + offs_d
        if V_GROUP > 0:   # [num_blocks, NUM_KV_HEADS, BLOCK_SIZE // V_GROUP, HEAD_DIM, V_GROUP]
            v_dst = v_cache_ptr + block * (NUM_KV_HEADS * HEAD_DIM * BLOCK_SIZE) + heads * (HEAD_DIM * BLOCK_SIZE) \
                + (row // V_GROUP) * (HEAD_DIM * V_GROUP) + offs_d * V_GROUP + row % V_GROUP
        else:
            v_dst = v_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM) + heads * HEAD_DIM + offs_d
        scales = block * (NUM_KV_HEADS * BLOCK_SIZE) + heads * BLOCK_SIZE + row      # head-major, [BLOCK_H, 1]
        ok = heads < NUM_KV_HEADS
        _store_rows(k_ptr + token * stride_k + heads * HEAD_DIM + offs_d, k_dst, k_scale_ptr + scales, ok,
                    QUANT, QMAX, MIN_SCALE, True)
        _store_rows(v_ptr + token * stride_v + heads * HEAD_DIM + offs_d, v_dst, v_scale_ptr + scales, ok,
                    QUANT, QMAX, MIN_SCALE, True)


@triton.jit(do_not_specialize=["stride_bt"])   # the block table's width varies by step: no recompiling (prefill)
def _store_window_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_tables_ptr,
                         context_lens_ptr, cu_q_ptr, stride_k, stride_v, stride_bt, NUM_KV_HEADS: tl.constexpr,
                         HEAD_DIM: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr,
                         MIN_SCALE: tl.constexpr, BLOCK_SIZE: tl.constexpr, V_GROUP: tl.constexpr,
                         WINDOW: tl.constexpr):
    window, seq, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    num_new = tl.load(cu_q_ptr + seq + 1) - q_start
    context_len = tl.load(context_lens_ptr + seq)
    first = context_len - num_new                          # position of the sequence's first new token
    start = (first // WINDOW + window) * WINDOW            # this program's positions: start .. start + WINDOW - 1
    if (num_new > 0) & (start < context_len):
        j = tl.arange(0, WINDOW)[:, None]                  # [WINDOW, 1]
        offs_d = tl.arange(0, HEAD_DIM)[None, :]
        ok = (start + j >= first) & (start + j < context_len)
        tokens = (q_start - first + start + j).to(tl.int64)
        block = tl.load(block_tables_ptr + seq * stride_bt + start // BLOCK_SIZE).to(tl.int64)
        row0 = start % BLOCK_SIZE
        k_dst = k_cache_ptr + (block * BLOCK_SIZE + row0 + j) * (NUM_KV_HEADS * HEAD_DIM) + head * HEAD_DIM + offs_d
        if V_GROUP > 0:   # the window is one group: [HEAD_DIM, WINDOW] contiguous
            v_dst = v_cache_ptr + block * (NUM_KV_HEADS * HEAD_DIM * BLOCK_SIZE) + head * (HEAD_DIM * BLOCK_SIZE) \
                + (row0 // V_GROUP) * (HEAD_DIM * V_GROUP) + offs_d * V_GROUP + j
        else:
            v_dst = v_cache_ptr + (block * BLOCK_SIZE + row0 + j) * (NUM_KV_HEADS * HEAD_DIM) + head * HEAD_DIM \
                + offs_d
        scales = block * (NUM_KV_HEADS * BLOCK_SIZE) + head * BLOCK_SIZE + row0 + j           # [WINDOW, 1]
        k_src = k_ptr + tokens * stride_k + head * HEAD_DIM + offs_d
        v_src = v_ptr + tokens * stride_v + head * HEAD_DIM + offs_d
        if (start >= first) & (start + WINDOW <= context_len):   # a whole window: unmasked, 16-byte stores
            _store_rows(k_src, k_dst, k_scale_ptr + scales, ok, QUANT, QMAX, MIN_SCALE, False)
            _store_rows(v_src, v_dst, v_scale_ptr + scales, ok, QUANT, QMAX, MIN_SCALE, False)
        else:
            _store_rows(k_src, k_dst, k_scale_ptr + scales, ok, QUANT, QMAX, MIN_SCALE, True)
            _store_rows(v_src, v_dst, v_scale_ptr + scales, ok, QUANT, QMAX, MIN_SCALE, True)


def _check(k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache) -> dict:
    """The layouts both kernels assume; returns the launch arguments they share."""
    num_tokens, num_kv_heads, head_dim = k.shape
    assert v.shape == k.shape
    assert k.stride(-1) == 1 and k.stride(-2) == head_dim and v.stride(-1) == 1 and v.stride(-2) == head_dim
    assert cache.k.shape[2:] == (num_kv_heads, head_dim)
    cache.check_storage()
    assert head_dim == triton.next_power_of_2(head_dim), "head_dim must be a power of 2"
    kind = kv_cache_kind(cache)
    k_scale = cache.k_scale if cache.quantized else cache.k      # unused pointers when not quantized
    v_scale = cache.v_scale if cache.quantized else cache.v
    return dict(args=(k, v, cache.k, cache.v, k_scale, v_scale),
                consts=dict(NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, QUANT=QUANT_CODES[kind],
                            QMAX=QMAX.get(kind, 1.0), MIN_SCALE=MIN_SCALE, BLOCK_SIZE=cache.k.shape[1],
                            V_GROUP=cache.v_group))


def store_kv(k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache, slot_mapping: torch.Tensor) -> None:
    """One program per token, to slot_mapping (-1: skip)."""
    assert slot_mapping.shape == (k.shape[0],)
    launch = _check(k, v, cache)
    _store_token_kernel[(k.shape[0],)](*launch["args"], slot_mapping, k.stride(0), v.stride(0),
                                       BLOCK_H=triton.next_power_of_2(k.shape[1]), **launch["consts"],
                                       **pdl_launch(k.device), num_warps=4)


def store_prompt_kv(k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache, meta: AttentionMetadata) -> None:
    """A prefill step: sequence i's tokens cu_seqlens_q[i]:cu_seqlens_q[i+1] are the last ones of its
    context_lens[i] positions; one program per aligned window of positions and KV head."""
    launch = _check(k, v, cache)
    window = v_key_group(cache.k.shape[1])    # a quantized V's group; never straddles two blocks
    grid = (triton.cdiv(meta.max_seqlen_q, window) + 1, meta.context_lens.shape[0], k.shape[1])
    _store_window_kernel[grid](*launch["args"], meta.block_tables, meta.context_lens, meta.cu_seqlens_q,
                               k.stride(0), v.stride(0), meta.block_tables.stride(0), WINDOW=window,
                               **launch["consts"], num_warps=4)


def store_step_kv(k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache, meta: AttentionMetadata) -> None:
    """This step's K/V into the cache: by windows of each prompt in an eager prefill, by token in a decode
    step or a CUDA graph's prefill (whose grid cannot depend on the step's longest chunk)."""
    if meta.is_prefill and meta.tiles is None:
        store_prompt_kv(k, v, cache, meta)
    else:
        store_kv(k, v, cache, meta.slot_mapping)
