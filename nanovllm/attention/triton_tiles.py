"""Pieces shared by the prefill and decode kernels (inlined by Triton into each kernel).

load_kv_tile: the K and V rows of one tile of keys of one sequence and KV head. Key n lives in block
block_table[n // BLOCK_SIZE] at row n % BLOCK_SIZE, i.e. at slot block * BLOCK_SIZE + n % BLOCK_SIZE of the
cache [num_blocks, block_size, num_kv_heads, head_dim]; INT8/FP8 scales are head-major within each block
([num_blocks, num_kv_heads, block_size], quant/kv.py), so one tile's scales are contiguous.
online_softmax: one tile of FlashAttention's streaming softmax in base 2, on scores s that still lack a
positive factor c per row (the softmax scale, and for INT8 dots the query's row scale). With running max
m and sum l,
    m' = max(m, c max_j s_j),  p_j = 2^(c s_j - m'),  alpha = 2^(m - m'),  l' = l * alpha + sum_j p_j
(c s_j - m' is one FMA per score instead of a multiply and a subtraction) and the caller rescales its
accumulator by alpha before adding p @ V.
int8_scores / int8_pv: the two dots on the INT8 tensor cores, straight on an INT8 cache's bytes. The query
is rounded per row to INT8 (`round_rows_to_int8`: a row's max |x| -> 127) and the int32 scores take the
row's scale in the softmax; the probabilities, V's per-key scales folded in, are rounded the same way per
row of each tile, and the int32 result multiplied by that scale. Rounding is half to even, done by the
float adder: for |y| <= 127, y + 1.5 * 2^23 is a float whose low mantissa bits hold round(y) in two's
complement, so the INT8 value is its low byte (one add per value instead of a division's three
multiplies and a compare, select, add and conversion). Reference: `attention_ref` with `v_scale`.
"""
import torch
import triton
import triton.language as tl

from nanovllm.attention.torch_ref import kv_cache_kind
from nanovllm.quant.kv import LayerKVCache

V_LOAD_KEYS = tl.constexpr(16)      # an 8-bit V's keys per 16-byte load


def check_paged_inputs(q: torch.Tensor, cache: LayerKVCache, block_tables: torch.Tensor) -> tuple[int, int]:
    """The layouts both kernels assume; returns (block_size, num_kv_heads)."""
    num_heads, head_dim = q.shape[1:]
    _, block_size, num_kv_heads, _ = cache.k.shape
    assert head_dim == triton.next_power_of_2(head_dim) and head_dim >= 16, "head_dim must be a power of 2"
    assert num_heads % num_kv_heads == 0 and q.stride(-1) == 1 and cache.k.stride(-1) == 1
    cache.check_storage()
    assert block_tables.dtype == torch.int32
    return block_size, num_kv_heads


def dot_kinds(cache: LayerKVCache, dtype: torch.dtype) -> dict[str, bool]:
    """How the prefill and decode kernels run their two dots for this cache: INT8_DOTS on an INT8 cache's
    bytes; DOT_FP16 for an FP8 cache with bfloat16 queries (an FP8 tile converts to float16 in half the
    instructions it takes to reach bfloat16); otherwise in the query's dtype."""
    kind = kv_cache_kind(cache)
    return {"INT8_DOTS": kind == "int8", "DOT_FP16": kind == "fp8" and dtype == torch.bfloat16}


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, block_tables_ptr, seq, kv_head, start_n, end, stride_bt, stride_cb,
                 stride_cs, stride_ch, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                 V_GROUP: tl.constexpr):
    """(K [BLOCK_N, HEAD_DIM], V [BLOCK_N, HEAD_DIM], block, rows [BLOCK_N], key_ok [BLOCK_N]) of the keys
    start_n .. start_n + BLOCK_N - 1 (start_n a multiple of BLOCK_N) that lie before `end`, K and V in the
    cache's dtype; key n is at row rows[n] of cache block `block` (a scalar when the tile lies in one block,
    else per key). V_GROUP > 0: V is stored [num_blocks, num_kv_heads, BLOCK_SIZE // V_GROUP, HEAD_DIM,
    V_GROUP] (a quantized cache, quant/kv.py); it is loaded with each group's keys contiguous and returned as
    a transposed view, the layout an 8-bit tensor-core dot P @ V wants."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    key_ok = offs_n < end
    if BLOCK_SIZE % BLOCK_N == 0:
        # The tile lies inside one cache block: one block-table entry, and the addresses are one scalar base
        # plus constant offsets (a block-table lookup and 64-bit address math per key cost the 8-bit
        # kernels ~12% of their instructions)
        block = tl.load(block_tables_ptr + seq * stride_bt + start_n // BLOCK_SIZE).to(tl.int64)
        rows = tl.multiple_of(start_n % BLOCK_SIZE, BLOCK_N) + tl.arange(0, BLOCK_N)
    else:
        block = tl.load(block_tables_ptr + seq * stride_bt + offs_n // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        rows = offs_n % BLOCK_SIZE
    kv_off = block * stride_cb + rows * stride_cs + kv_head * stride_ch
    k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    if V_GROUP > 0:
        v_off = block * stride_cb + kv_head * (HEAD_DIM * BLOCK_SIZE) \
            + (rows // V_GROUP) * (HEAD_DIM * V_GROUP) + rows % V_GROUP        # [BLOCK_N]
        v_ptrs = v_cache_ptr + offs_d[:, None] * V_GROUP + v_off[None, :]      # [HEAD_DIM, BLOCK_N]
        if BLOCK_SIZE % BLOCK_N == 0:
            # Masked per 16 keys, so that the loads stay 16 bytes wide and a short context's last tile reads
            # no more than 15 keys past its end: those are still inside this sequence's block, hold finite
            # values (quant/kv.py), and get probability 0
            chunk_ok = start_n + tl.arange(0, BLOCK_N) // V_LOAD_KEYS * V_LOAD_KEYS < end
            vt = tl.load(v_ptrs, mask=chunk_ok[None, :], other=0.0)
        else:
            vt = tl.load(v_ptrs, mask=key_ok[None, :], other=0.0)
        v = tl.trans(vt)
    else:
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)
    return k, v, block, rows, key_ok


@triton.jit
def key_scales(scale_ptr, block, rows, kv_head, key_ok, stride_sb, BLOCK_SIZE: tl.constexpr):
    """Per-key INT8/FP8 scales of one KV head as a [1, BLOCK_N] row, to multiply score or probability columns
    (scales head-major: [num_blocks, num_kv_heads, BLOCK_SIZE], stride_sb apart per block)."""
    return tl.load(scale_ptr + block * stride_sb + kv_head * BLOCK_SIZE + rows, mask=key_ok, other=0.0)[None, :]


@triton.jit
def online_softmax(s, row_scale, m_i, l_i):
    """s [rows, BLOCK_N] (masked keys at -inf), to be multiplied by row_scale [rows] (> 0) -> (p, alpha, new
    running max, new running sum)."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * row_scale)
    p = tl.exp2(s * row_scale[:, None] - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


ROUND_MAGIC = tl.constexpr(12582912.0)   # 1.5 * 2^23: y + ROUND_MAGIC holds round(y) in its low bits


@triton.jit
def round_rows_to_int8(x):
    """(x [rows, cols] rounded to INT8, per row: its max |x| -> 127, half to even; the scales [rows])."""
    scale = tl.maximum(tl.max(tl.abs(x), 1), 1e-30) / 127.0
    y = x * (1.0 / scale)[:, None]
    return (y + ROUND_MAGIC).to(tl.int32, bitcast=True).to(tl.int8), scale


@triton.jit
def int8_query(q, qk_scale):
    """The query rounded per row to INT8 once per program: (q8, its row scales times the softmax scale, the
    scores' row factor for online_softmax)."""
    q8, q_scale = round_rows_to_int8(q.to(tl.float32))
    return q8, q_scale * qk_scale


@triton.jit
def int8_scores(q8, k):
    """Scores [rows, BLOCK_N] of the INT8-rounded query against an INT8 K tile, before the query's row scales
    (online_softmax applies them) and K's per-key scales."""
    return tl.dot(q8, tl.trans(k), out_dtype=tl.int32).to(tl.float32)


@triton.jit
def int8_pv(p, v):
    """p [rows, BLOCK_N] (probabilities times V's per-key scales, >= 0) @ an INT8 V tile, p rounded to INT8."""
    p8, p_scale = round_rows_to_int8(p)
    return tl.dot(p8, v, out_dtype=tl.int32).to(tl.float32) * p_scale[:, None]
