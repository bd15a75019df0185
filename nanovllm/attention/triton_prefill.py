"""Prefill kernel: causal attention of variable-length query chunks over K/V read through block tables.

Sequence i has queries q[cu_seqlens_q[i]:cu_seqlens_q[i+1]] (n_q of them), the last n_q positions of a
context of context_lens[i] tokens already in the cache (prefix-cache hits and earlier chunks included).
Query row r sits at position context_len - n_q + r and sees keys 0..that position.

Grid: (query tiles of BLOCK_M, sequences, query heads), or, in a CUDA graph, (entries of a tile map
built on the host, 1, query heads): the graph's grid is fixed, and a map of (sequence, tile) pairs padded
with empty entries lets one captured launch serve any mix of sequence lengths. Each program streams its
keys in tiles of BLOCK_N, looking up each key's block in the block table (so any block size works), with
the online softmax of FlashAttention: running max m, running sum l, rescaled accumulator. Scores use exp2 with the scale
folded into log2(e). Only key tiles that reach the query tile's first position or the context's end are
masked; the ones before it are visible to every row. With an FP8 cache the tiles are converted to float16
in registers and the dots run in float16 (the query converted once, as in the decode kernel); with an INT8
cache both dots run on the INT8 tensor cores on the cache's bytes (query and P rounded per row to INT8, as
in the decode kernel). Either way the per-key scales are applied where they cost least: K's to the score
columns, V's to the probability columns before the second dot (never a dequantized copy of the cache in
memory).
Reference: `paged_attention_ref`.
"""
import numpy as np
import torch
import triton
import triton.language as tl

from nanovllm.attention.torch_ref import paged_attention_ref
from nanovllm.attention.triton_tiles import (
    check_paged_inputs,
    dot_kinds,
    int8_pv,
    int8_query,
    int8_scores,
    key_scales,
    load_kv_tile,
    online_softmax,
)
from nanovllm.quant.kv import LayerKVCache
from nanovllm.utils.precision import dot_precision

__all__ = ["prefill_attention", "flat_tiles", "paged_attention_ref"]
FLAT_BLOCK_M = 16   # query rows per tile of a tile-map launch (mixed steps: most sequences bring one query)


@triton.jit
def _attend(acc, m_i, l_i, q, q8, row_scale, q_pos, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
            block_tables_ptr, seq, kv_head, start, stop, context_len, stride_bt, stride_cb, stride_cs, stride_ch,
            stride_sb, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
            DOT_PRECISION: tl.constexpr, QUANT: tl.constexpr, V_GROUP: tl.constexpr, INT8_DOTS: tl.constexpr,
            MASKED: tl.constexpr):
    """Key tiles start .. stop - 1 (BLOCK_N apart) folded into the running (acc, m, l). MASKED: the tiles
    on the causal diagonal or at the context's end; the others need no mask, and a loop without a branch
    in it is one Triton can software-pipeline."""
    for start_n in range(start, stop, BLOCK_N):
        k, v, block, rows, key_ok = load_kv_tile(k_cache_ptr, v_cache_ptr, block_tables_ptr, seq, kv_head,
                                                 start_n, context_len, stride_bt, stride_cb, stride_cs,
                                                 stride_ch, BLOCK_SIZE, HEAD_DIM, BLOCK_N, V_GROUP)
        if INT8_DOTS:
            s = int8_scores(q8, k)                                            # [BLOCK_M, BLOCK_N]
        else:
            s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)
        if QUANT:   # K's per-key scales multiply the score columns
            s = s * key_scales(k_scale_ptr, block, rows, kv_head, key_ok, stride_sb, BLOCK_SIZE)
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            s = tl.where((offs_n[None, :] <= q_pos[:, None]) & key_ok[None, :], s, float("-inf"))
        p, alpha, m_i, l_i = online_softmax(s, row_scale, m_i, l_i)
        if QUANT:   # V's per-key scales multiply the probability columns (after l is updated)
            p = p * key_scales(v_scale_ptr, block, rows, kv_head, key_ok, stride_sb, BLOCK_SIZE)
        acc = acc * alpha[:, None]
        if INT8_DOTS:
            acc += int8_pv(p, v)
        else:   # accumulated inside the tensor-core dot
            acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc, input_precision=DOT_PRECISION)
    return acc, m_i, l_i


# Triton compiles a kernel again for an integer argument that becomes 1 or a multiple of 16; these two vary from
# step to step (the block table is as wide as the step's longest sequence), so none of that mid-run
@triton.jit(do_not_specialize=["first_seq", "stride_bt"])
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, out_ptr, block_tables_ptr,
                    context_lens_ptr, cu_q_ptr, tiles_ptr, first_seq, qk_scale, stride_qt, stride_qh, stride_ot,
                    stride_oh, stride_bt, stride_cb, stride_cs, stride_ch, stride_sb,
                    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    QUANT: tl.constexpr, V_GROUP: tl.constexpr, DOT_FP16: tl.constexpr, INT8_DOTS: tl.constexpr,
                    FLAT: tl.constexpr):
    head = tl.program_id(2)
    if FLAT:   # one program per entry of the tile map: (sequence, query tile), sequence -1 = padding
        seq = tl.load(tiles_ptr + 2 * tl.program_id(0))
        tile = tl.load(tiles_ptr + 2 * tl.program_id(0) + 1)
    else:      # sequences first_seq.. (an eager mixed step's decode rows, before them, go to the decode kernel)
        seq = tl.program_id(1) + first_seq
    q_start = tl.load(cu_q_ptr + tl.maximum(seq, 0))
    q_len = tl.load(cu_q_ptr + tl.maximum(seq, 0) + 1) - q_start
    if not FLAT:   # the last tile, which sees the most keys, starts first: a causal grid's tail is short
        tile = tl.cdiv(q_len, BLOCK_M) - 1 - tl.program_id(0)
    if (seq >= 0) & (tile >= 0) & (tile * BLOCK_M < q_len):
        context_len = tl.load(context_lens_ptr + seq)
        kv_head = head // GROUP
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        row_ok = offs_m < q_len
        q_rows = (q_start + offs_m).to(tl.int64)
        q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
        q_pos = context_len - q_len + offs_m
        if DOT_FP16:   # FP8 cache: the dots run in float16 (an FP8 tile converts to it in half the instructions)
            q = q.to(tl.float16)
        row_scale = tl.full([BLOCK_M], qk_scale, tl.float32)   # the scores' factor in the softmax
        q8 = q
        if INT8_DOTS:  # INT8 cache: the dots run on the INT8 tensor cores (triton_tiles.int8_scores / int8_pv)
            q8, row_scale = int8_query(q, qk_scale)   # the query's row scales, the softmax scale in them
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        end = tl.minimum(context_len, context_len - q_len + (tile + 1) * BLOCK_M)
        # keys before the tile's first position are visible to all its rows: tiles that end there need no mask
        unmasked_end = (context_len - q_len + tile * BLOCK_M + 1) // BLOCK_N * BLOCK_N
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, q8, row_scale, q_pos, k_cache_ptr, v_cache_ptr, k_scale_ptr,
                                v_scale_ptr, block_tables_ptr, seq, kv_head, 0, unmasked_end, context_len,
                                stride_bt, stride_cb, stride_cs, stride_ch, stride_sb, BLOCK_SIZE, HEAD_DIM,
                                BLOCK_N, DOT_PRECISION, QUANT, V_GROUP, INT8_DOTS, MASKED=False)
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, q8, row_scale, q_pos, k_cache_ptr, v_cache_ptr, k_scale_ptr,
                                v_scale_ptr, block_tables_ptr, seq, kv_head, unmasked_end, end, context_len,
                                stride_bt, stride_cb, stride_cs, stride_ch, stride_sb, BLOCK_SIZE, HEAD_DIM,
                                BLOCK_N, DOT_PRECISION, QUANT, V_GROUP, INT8_DOTS, MASKED=True)
        out = acc / l_i[:, None]
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def prefill_settings(cache: LayerKVCache, head_dim: int, max_seqlen_q: int) -> dict:
    """Launch settings: 64-query tiles (16 for short chunks); 32-key tiles at head_dim 128 (64 below), and
    128 for a quantized cache, whose longer tiles spread its per-tile work (scale loads; INT8 rounds P per
    tile row) over more keys. Long chunks (over 1,024 queries, the long workload's) take 64-key tiles at
    head_dim 128 in bf16. Each choice was the fastest measured (docs/features/triton_attention; timings by
    `benchmarks/bench_prefill_attention.py`)."""
    block_n = 64 if head_dim <= 64 else 32
    if cache.quantized and head_dim >= 128:
        block_n = 128
    elif max_seqlen_q > 1024:
        block_n = 64
    return {"block_m": 64 if max_seqlen_q > 32 else 16, "block_n": block_n, "num_warps": 4, "num_stages": 2}


def flat_tiles(q_lens, capacity: int | None = None) -> np.ndarray:
    """The tile map of a launch that reads no host length: int32 [capacity, 2] of (sequence, query tile
    of FLAT_BLOCK_M rows), one row per tile of every sequence's queries, then (-1, 0) rows (nothing to do).
    A CUDA graph captures the launch over `capacity` tiles; sum(ceil(q_len / 16)) never exceeds
    num_tokens / 16 + num_seqs."""
    q_lens = np.asarray(q_lens, dtype=np.int64)
    counts = (q_lens + FLAT_BLOCK_M - 1) // FLAT_BLOCK_M
    total = int(counts.sum())
    capacity = total if capacity is None else capacity
    assert total <= capacity, f"{total} query tiles do not fit a map of {capacity}"
    tiles = np.zeros((capacity, 2), dtype=np.int32)
    tiles[:, 0] = -1
    tiles[:total, 0] = np.repeat(np.arange(len(q_lens)), counts)
    tiles[:total, 1] = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    return tiles


def prefill_attention(q: torch.Tensor, cache: LayerKVCache, block_tables: torch.Tensor, context_lens: torch.Tensor,
                      cu_seqlens_q: torch.Tensor, max_seqlen_q: int, scale: float,
                      settings: dict | None = None, tiles: torch.Tensor | None = None,
                      out: torch.Tensor | None = None, first_seq: int = 0) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim] -> out of the same shape. `settings`: launch settings
    ({"block_m", "block_n", "num_warps", "num_stages"}), by default `prefill_settings`. `tiles`: a tile
    map on the device (`flat_tiles`), for a launch whose grid depends on no host value (CUDA graphs):
    max_seqlen_q is then ignored and query tiles have FLAT_BLOCK_M rows. Rows of q that no tile covers
    (padding) are left unwritten. `out`: where to write (by default a new tensor like q). `first_seq`:
    attend only sequences first_seq.. (without a tile map), leaving the rows of the others unwritten; the
    tensors stay whole, since a slice (context_lens[i:]) can move an address off the 16-byte alignment
    Triton compiles for, and the kernel would compile again in the middle of a run."""
    k_cache, v_cache = cache.k, cache.v
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = check_paged_inputs(q, cache, block_tables)
    if tiles is not None:
        settings = {**(settings or prefill_settings(cache, head_dim, 1)), "block_m": FLAT_BLOCK_M}
        grid = (tiles.shape[0], 1, num_heads)
    else:
        settings = settings or prefill_settings(cache, head_dim, max_seqlen_q)
        grid = (triton.cdiv(max_seqlen_q, settings["block_m"]), context_lens.shape[0] - first_seq, num_heads)
    out = torch.empty_like(q) if out is None else out
    k_scale, v_scale = (cache.k_scale, cache.v_scale) if cache.quantized else (k_cache, v_cache)
    _prefill_kernel[grid](q, k_cache, v_cache, k_scale, v_scale, out, block_tables, context_lens, cu_seqlens_q,
                          cu_seqlens_q if tiles is None else tiles, first_seq if tiles is None else 0,
                          scale * 1.4426950408889634,
                          q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                          block_tables.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                          k_scale.stride(0) if cache.quantized else 0, QUANT=cache.quantized,
                          V_GROUP=cache.v_group, **dot_kinds(cache, q.dtype),
                          GROUP=num_heads // num_kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
                          BLOCK_M=settings["block_m"], BLOCK_N=settings["block_n"],
                          DOT_PRECISION=dot_precision(q.dtype), FLAT=tiles is not None,
                          num_warps=settings["num_warps"], num_stages=settings["num_stages"])
    return out
