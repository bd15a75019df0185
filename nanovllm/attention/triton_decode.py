"""Decode kernel: one new query token per sequence, split-KV (flash-decoding), GQA-batched.

Decode is bound by reading the KV cache, so each byte is read once: one program serves all GROUP query
heads that share a KV head (padded to BLOCK_G rows for tl.dot) over one slice of the context.
Grid: (KV heads, sequences, NUM_SPLITS), in launch order. Programs of one batch differ in length by the
sequence's context (100 to 2,000 keys in bench.py), and the GPU starts them in launch order: a long one
started last would run alone at the end. With `order` (the batch's rows, longest context first; the model
runner passes it) the longest start first and the short ones fill the gaps, as longest-job-first
scheduling does. With one split the program normalizes and writes the output;
with several, each writes its unnormalized accumulator and its softmax statistics (max m, sum l) and a
second kernel combines them:
    out = sum_i exp2(m_i - M) acc_i / sum_i exp2(m_i - M) l_i,   M = max_i m_i.
Context lengths are read on the device, so the launch is the same for every step and fits a CUDA graph.
With a quantized cache K's scales multiply the score columns and V's the probability columns, so the cache
is read once and never expanded in memory.
Scores and the weighted sum of V use tl.dot (tensor cores, the group padded to 16 rows); Triton's pipeliner
copies the next K/V tile into shared memory (cp.async) while the current one is computed. An FP8 tile is
converted to float16 (one instruction per two values; to bfloat16 it takes several per value), so with an
FP8 cache the dots run in float16 (the query converted once). An INT8 tile is not converted at all: both
dots run on the INT8 tensor cores (the query rounded per row to INT8 once, P times V's scales rounded per
row of each tile; triton_tiles.int8_scores / int8_pv), which needs tiles of at least 32 keys.
Launch settings (keys per tile, warps, pipeline stages) come per GPU model, head_dim, KV cache dtype and
launch size (programs per SM, fixed per CUDA graph by its batch size) from tuned/decode-<GPU>.json, as vLLM
ships tuned kernel configs per device; DEFAULT_SETTINGS elsewhere. `benchmarks/bench_decode_steps.py --write`
writes it from bench.py's decode steps timed in CUDA graphs: on the H200 an INT8 or FP8 cache runs full
batches fastest as 2-warp programs over 64-key tiles, and fewer programs as larger ones over 128 keys.
The file's top level was measured at head_dim 128 (Qwen3, Llama 8B); other head dims have their own entry
under "by_head_dim" (`bench_decode_steps.py --model Llama-3.2-1B` writes head_dim 64's). A head_dim with
no entry takes the head_dim-128 settings with tiles of the same bytes (block_n scaled by 128 / head_dim):
a tile's fixed cost (its softmax, its loop trip) is paid per tile, so at head_dim 64 a 64-key tile reads
half the bytes for the same overhead.
Reference: `paged_attention_ref` with one query per sequence.
"""
import functools
import os

import torch
import triton
import triton.language as tl

from nanovllm.attention.torch_ref import kv_cache_kind, paged_attention_ref
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
from nanovllm.utils.pdl import pdl_launch, wait_then_release
from nanovllm.utils.precision import dot_precision
from nanovllm.utils.tuned import device_name, num_sms, read_tuned, tuned_path

DEFAULT_SETTINGS = {"block_n": 64, "num_warps": 4, "num_stages": 3}
TUNED_HEAD_DIM = 128       # what DEFAULT_SETTINGS and a tuned file's top level were measured at
MAX_BLOCK_N = 256
INT8_MIN_BLOCK_N = 32
SHARED_ROWS = 64           # (sequence, head) pairs per program of the cascade's shared-prefix launch
TUNED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned")


def tuned_settings_path(gpu_name: str) -> str:
    return tuned_path(TUNED_DIR, "decode", gpu_name)


@functools.cache
def tuned_table(gpu_name: str) -> dict:
    """This GPU model's measured launch settings ({} if never measured): "settings" per KV cache dtype, and
    "many_programs" per dtype, a list of settings each for launches of at least its `min_programs_per_sm`
    programs per SM (ascending)."""
    return read_tuned(TUNED_DIR, "decode", gpu_name)


def tuned_settings(gpu_name: str) -> dict[str, dict]:
    """KV cache dtype -> launch settings measured fastest on this GPU model ({} if never measured)."""
    return tuned_table(gpu_name).get("settings", {})


def pick_settings(table: dict, kind: str, programs_per_sm: float, head_dim: int = TUNED_HEAD_DIM) -> dict:
    """The launch settings of a tuned table for this KV cache dtype, launch size and head_dim. Many programs
    per SM favour small ones (bench.py's full batches: 2 warps over 64-key tiles); fewer programs favour
    larger ones, which keep more warps busy on each SM. A head_dim without its own entry scales block_n to
    keep the tile's bytes."""
    entry = table.get("by_head_dim", {}).get(str(head_dim))
    if entry is None:
        entry = table
        scale = TUNED_HEAD_DIM / head_dim
    else:
        scale = 1
    settings = entry.get("settings", {}).get(kind, DEFAULT_SETTINGS)
    for tier in entry.get("many_programs", {}).get(kind, []):    # ascending min_programs_per_sm
        if programs_per_sm >= tier["min_programs_per_sm"]:
            settings = {key: value for key, value in tier.items() if key != "min_programs_per_sm"}
    if scale != 1 and "block_n" in settings:
        block_n = min(MAX_BLOCK_N, max(16, triton.next_power_of_2(int(settings["block_n"] * scale))))
        settings = {**settings, "block_n": block_n}
    return settings


def launch_settings(cache: LayerKVCache, num_programs: int = 0) -> dict:
    """Tuned settings for this GPU model, head_dim, KV cache dtype and number of programs (DEFAULT_SETTINGS on
    CPU)."""
    if not cache.k.is_cuda:
        return DEFAULT_SETTINGS
    table = tuned_table(device_name(cache.k.device))
    return pick_settings(table, kv_cache_kind(cache), num_programs / num_sms(cache.k.device), cache.k.shape[-1])


__all__ = ["decode_attention", "paged_attention_ref"]


@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])   # vary by eager step: no recompiling (triton_prefill)
def _decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
                   block_tables_ptr, context_lens_ptr, order_ptr, shared_ptr, num_seqs, qk_scale,
                   stride_qt, stride_qh, stride_ot, stride_oh, stride_bt, stride_cb, stride_cs, stride_ch, stride_sb,
                   GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   QUANT: tl.constexpr, V_GROUP: tl.constexpr, DOT_FP16: tl.constexpr, INT8_DOTS: tl.constexpr,
                   ORDERED: tl.constexpr, PDL: tl.constexpr, CASCADE: tl.constexpr, SHARED: tl.constexpr):
    wait_then_release(PDL)        # the o projection may start loading its weights (utils/pdl.py)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    num_parts = NUM_SPLITS + CASCADE          # partials per (sequence, head): the splits, then the shared prefix
    if SHARED:     # cascade, first level: BLOCK_G rows of (sequence, head) pairs over the shared prefix's keys
        kv_head, tile, split = tl.program_id(0), tl.program_id(1), NUM_SPLITS
        r = tile * BLOCK_G + offs_g
        seq = r // GROUP
        heads = kv_head * GROUP + r % GROUP
        head_ok = seq < num_seqs
        start = 0
        end = tl.load(shared_ptr)
        if end == 0:   # nothing shared this step: the combine reads no shared partial
            return
        table_row = tl.load(shared_ptr + 1)   # a row that holds it: the prefix's blocks are the same in all
        q_rows, out_rows = seq[:, None] * stride_qt, seq[:, None] * stride_ot
        own_only = False
    else:
        kv_head, seq, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        if ORDERED:
            seq = tl.load(order_ptr + seq)
        context_len = tl.load(context_lens_ptr + seq)
        if context_len == 0:   # not a decode row (a mixed graph's prefill row, padding): its output is left alone
            return
        first = 0
        if CASCADE:   # second level: a sharer's keys after the shared prefix, another row's all keys
            first = tl.minimum(tl.load(shared_ptr + 2 + seq), context_len)
        split_len = tl.cdiv(tl.cdiv(context_len - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = first + split * split_len
        end = tl.minimum(start + split_len, context_len)
        heads = kv_head * GROUP + offs_g
        head_ok = offs_g < GROUP
        table_row = seq
        q_rows, out_rows = seq * stride_qt, seq * stride_ot
        if NUM_SPLITS == 1:
            own_only = first == 0     # no other part to combine (always without cascade): write the output
        else:
            own_only = False
    q = tl.load(q_ptr + q_rows + heads[:, None] * stride_qh + offs_d[None, :],
                mask=head_ok[:, None], other=0.0)
    if DOT_FP16:   # FP8 cache: the dots run in float16
        q = q.to(tl.float16)
    row_scale = tl.full([BLOCK_G], qk_scale, tl.float32)   # the scores' factor in the softmax
    if INT8_DOTS:  # INT8 cache: the dots run on the INT8 tensor cores (triton_tiles.int8_scores / int8_pv)
        q8, row_scale = int8_query(q, qk_scale)   # the query's row scales, the softmax scale in them
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for start_n in range(start, end, BLOCK_N):
        k, v, block, rows, key_ok = load_kv_tile(k_cache_ptr, v_cache_ptr, block_tables_ptr, table_row, kv_head,
                                                 start_n, end, stride_bt, stride_cb, stride_cs, stride_ch,
                                                 BLOCK_SIZE, HEAD_DIM, BLOCK_N, V_GROUP)
        if INT8_DOTS:
            s = int8_scores(q8, k)
        else:
            s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)
        if QUANT:   # K's per-key scales multiply the score columns
            s = s * key_scales(k_scale_ptr, block, rows, kv_head, key_ok, stride_sb, BLOCK_SIZE)
        p, alpha, m_i, l_i = online_softmax(tl.where(key_ok[None, :], s, float("-inf")), row_scale, m_i, l_i)
        if QUANT:   # V's per-key scales multiply the probability columns (after l is updated)
            p = p * key_scales(v_scale_ptr, block, rows, kv_head, key_ok, stride_sb, BLOCK_SIZE)
        if INT8_DOTS:
            pv = int8_pv(p, v)
        else:
            pv = tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
    if own_only:
        out = acc / l_i[:, None]
        tl.store(out_ptr + out_rows + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None])
    else:
        row = (seq * (tl.num_programs(0) * GROUP) + heads) * num_parts + split     # [BLOCK_G]
        tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=head_ok[:, None])
        tl.store(part_ml_ptr + row * 2, m_i, mask=head_ok)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=head_ok)


@triton.jit
def _combine_kernel(part_acc_ptr, part_ml_ptr, out_ptr, context_lens_ptr, shared_ptr, stride_ot, stride_oh,
                    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, CASCADE: tl.constexpr, BLOCK_P: tl.constexpr,
                    PDL: tl.constexpr):
    wait_then_release(PDL)        # the o projection may start loading its weights (utils/pdl.py)
    seq, head = tl.program_id(0), tl.program_id(1)
    if tl.load(context_lens_ptr + seq) == 0:   # no decode row: no partials, the output is left alone
        return
    part = tl.arange(0, BLOCK_P)
    num_used = NUM_SPLITS
    if CASCADE:   # the last part is the shared prefix's, written only for its sharers
        shared_len = tl.load(shared_ptr + 2 + seq)
        if NUM_SPLITS == 1:
            if shared_len == 0:
                return    # not a sharer: the decode kernel wrote this row's output itself
        num_used = NUM_SPLITS + (shared_len > 0).to(tl.int32)
    ok = part < num_used
    rows = (seq * tl.num_programs(1) + head) * (NUM_SPLITS + CASCADE) + part
    m = tl.load(part_ml_ptr + rows * 2, mask=ok, other=float("-inf"))
    l_sum = tl.load(part_ml_ptr + rows * 2 + 1, mask=ok, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(m > float("-inf"), tl.exp2(m - m_max), 0.0)                     # empty splits weigh 0
    acc = tl.load(part_acc_ptr + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], mask=ok[:, None],
                  other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l_sum * w, 0)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + tl.arange(0, HEAD_DIM),
             out.to(out_ptr.dtype.element_ty))


def num_decode_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, num_sms: int = 132) -> int:
    """Enough programs to fill the GPU about twice, never slices shorter than 256 keys; a power of 2."""
    want = triton.cdiv(2 * num_sms, num_seqs * num_kv_heads)
    want = min(want, max(1, max_context_len // 256), 32)
    return triton.next_power_of_2(want) if want > 1 else 1


def decode_attention(q: torch.Tensor, cache: LayerKVCache, block_tables: torch.Tensor, context_lens: torch.Tensor,
                     scale: float, num_splits: int = 1, settings: dict | None = None,
                     order: torch.Tensor | None = None, shared: torch.Tensor | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """q [num_seqs, num_heads, head_dim] (one token each) -> out of the same shape. `settings`: launch
    settings ({"block_n", "num_warps", "num_stages"} and optionally "maxnreg", a cap on registers per
    thread), by default the tuned ones for this GPU and launch size.
    `order`: int32 [num_seqs], a permutation of the rows in the order to start them (longest context first;
    metadata.decode_order); it changes only the speed.
    `shared`: int32 [2 + num_seqs] on the device, for cascade attention (metadata.shared_prefix): the
    prefix length L (whole blocks), a row that holds it, then per row L or 0. The sharers' first L keys are
    the same blocks in each of their tables; their K/V are read once per KV head for all sharers (a second
    launch over tiles of (sequence, head) pairs), each row's other keys as usual. L = 0 shares nothing.
    `out`: where to write (by default a new tensor like q). Rows whose context length is 0 are not decode rows
    (a mixed graph's prefill rows, padding): their output is left unwritten (the prefill kernel writes the
    former), so nothing depends on which of the two launches writes last."""
    k_cache, v_cache = cache.k, cache.v
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = check_paged_inputs(q, cache, block_tables)
    assert num_splits == triton.next_power_of_2(num_splits)
    group = num_heads // num_kv_heads
    out = torch.empty_like(q) if out is None else out
    cascade = shared is not None
    num_parts = num_splits + cascade
    part_acc = part_ml = out   # unused with one part
    if num_parts > 1:
        part_acc = torch.empty(num_seqs * num_heads * num_parts, head_dim, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(num_seqs * num_heads * num_parts, 2, dtype=torch.float32, device=q.device)
    k_scale, v_scale = (cache.k_scale, cache.v_scale) if cache.quantized else (k_cache, v_cache)
    settings = settings or launch_settings(cache, num_seqs * num_kv_heads * num_splits)
    kind = kv_cache_kind(cache)
    # an INT8 mma multiplies 32-deep: P @ V needs at least 32 keys per tile
    block_n = max(settings["block_n"], INT8_MIN_BLOCK_N) if kind == "int8" else settings["block_n"]
    args = (q, k_cache, v_cache, k_scale, v_scale, out, part_acc, part_ml, block_tables, context_lens,
            context_lens if order is None else order, context_lens if shared is None else shared, num_seqs,
            scale * 1.4426950408889634, q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_scale.stride(0) if cache.quantized else 0)
    consts = dict(QUANT=cache.quantized, V_GROUP=cache.v_group, **dot_kinds(cache, q.dtype), GROUP=group,
                  BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_N=block_n, NUM_SPLITS=num_splits,
                  DOT_PRECISION=dot_precision(q.dtype), CASCADE=cascade)
    if cascade:   # the shared prefix: one program per KV head and SHARED_ROWS (sequence, head) pairs
        _decode_kernel[(num_kv_heads, triton.cdiv(num_seqs * group, SHARED_ROWS), 1)](
            *args, **consts, ORDERED=False, BLOCK_G=SHARED_ROWS, SHARED=True, PDL=False, num_warps=4, num_stages=2)
    _decode_kernel[(num_kv_heads, num_seqs, num_splits)](
        *args, **consts, ORDERED=order is not None, BLOCK_G=max(16, triton.next_power_of_2(group)), SHARED=False,
        **pdl_launch(q.device), num_warps=settings["num_warps"], num_stages=settings["num_stages"],
        **({"maxnreg": settings["maxnreg"]} if settings.get("maxnreg") else {}))
    if num_parts > 1:
        _combine_kernel[(num_seqs, num_heads)](part_acc, part_ml, out, context_lens,
                                               context_lens if shared is None else shared,
                                               out.stride(0), out.stride(1), HEAD_DIM=head_dim,
                                               NUM_SPLITS=num_splits, CASCADE=cascade,
                                               BLOCK_P=triton.next_power_of_2(num_parts), **pdl_launch(q.device))
    return out
