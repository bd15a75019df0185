"""Triton attention kernels against the plain-PyTorch reference (CPU: interpreter, tiny; GPU: real sizes)."""
from itertools import product

import pytest
import torch
from attention_cases import make_case, rel_err, slots_for

from nanovllm.attention.metadata import decode_order
from nanovllm.attention.torch_ref import paged_attention_ref, store_kv_ref
from nanovllm.quant.kv import LayerKVCache, allocate, dequantize_ref, quantize_ref

triton = pytest.importorskip("triton")
from nanovllm.attention.triton_decode import decode_attention, num_decode_splits  # noqa: E402
from nanovllm.attention.triton_prefill import prefill_attention  # noqa: E402
from nanovllm.attention.triton_store import store_kv, store_prompt_kv  # noqa: E402
from nanovllm.attention.triton_tiles import round_rows_to_int8  # noqa: E402

tl = triton.language

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.bfloat16, torch.float16] if CUDA else [torch.float16, torch.float32]
TOL = {torch.float32: 2e-3, torch.float16: 2e-2, torch.bfloat16: 3e-2}

# (query_lens, context_lens): fresh prompts, prefix-cache hits / later chunks, single tokens
PREFILL_SHAPES = [([5, 17, 1], [5, 17, 1]), ([8, 3], [40, 67]), ([33], [33])] if not CUDA else \
    [([500, 1, 77, 1024], [500, 1, 77, 1024]), ([128, 300, 7], [1000, 900, 2000]), ([4096], [8192])]
DECODE_SHAPES = [[1, 17, 70], [33]] if not CUDA else [[1, 100, 1000, 4000] * 8, [8192] * 4, [513] * 256]
GQA = [(4, 4), (4, 2), (8, 2)] if not CUDA else [(16, 8), (32, 8), (8, 8), (32, 4)]
HEAD_DIMS = [64, 128] if CUDA else [32, 64]
BLOCK_SIZES = [16, 32] if not CUDA else [16, 64, 256]
KV_DTYPES = ["auto", "int8", "fp8"]


def grid(modes: list[list], sizes: list[list]) -> list[tuple]:
    """(dtype, *mode, *size) cases. On the GPU every combination. On CPU, where the interpreter runs a case
    in about 0.4 s: float32 takes every mode with the first of each size axis (it differs from float16 in
    the dots' precision and the casts, not in how tiles cover sizes); float16 takes every size combination
    with every value of the last mode axis (the KV cache dtype, which changes how tiles are loaded), the
    other mode axes taken in turn, shifted for each value of the last so that they meet every size."""
    cases = []
    for dtype in DTYPES:
        if CUDA or dtype == torch.float32:
            size_axes = sizes if CUDA else [axis[:1] for axis in sizes]
            cases += [(dtype, *mode, *size) for mode in product(*modes) for size in product(*size_axes)]
            continue
        others, all_sizes = list(product(*modes[:-1])), list(product(*sizes))
        for j, last in enumerate(modes[-1]):
            cases += [(dtype, *others[(i + j) % len(others)], last, *size) for i, size in enumerate(all_sizes)]
    return cases


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA[:2] + [(6, 3)])
@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_store_kv_matches_reference(dtype, heads, kv_cache_dtype):
    q, cache, meta = make_case([5, 9], [5, 20], heads[0], heads[1], 32, 16, dtype, DEVICE,
                               kv_cache_dtype=kv_cache_dtype)
    slots = slots_for(meta, 16, [5, 9])
    slots[2] = -1                                          # padding token: must not be written
    width = heads[1] * 32
    qkv = torch.randn(len(slots), 3 * width, dtype=dtype, device=DEVICE) * 3
    k, v = qkv[:, :width].view(-1, heads[1], 32), qkv[:, width:2 * width].view(-1, heads[1], 32)
    ref = LayerKVCache(*(t.clone() if t is not None else None
                         for t in (cache.k, cache.v, cache.k_scale, cache.v_scale)))
    store_kv_ref(k, v, ref, slots)
    store_kv(k, v, cache, slots)
    if kv_cache_dtype == "auto":
        assert torch.equal(cache.k, ref.k) and torch.equal(cache.v, ref.v)
        return
    torch.testing.assert_close(cache.k_scale, ref.k_scale, rtol=1e-6, atol=0)
    torch.testing.assert_close(cache.v_scale, ref.v_scale, rtol=1e-6, atol=0)
    # values may differ where x / scale sits on a rounding boundary (float division differs by an ulp)
    for got, want, x, scales in ((cache.k, ref.k, k, cache.k_scale), (cache.v_slots, ref.v_slots, v, cache.v_scale)):
        assert (got.float() != want.float()).float().mean() < 0.01
        if kv_cache_dtype == "int8":
            assert (got.float() - want.float()).abs().max() <= 1
        flat_scales = scales.reshape(-1, scales.shape[-1])[slots[slots >= 0]]
        stored = dequantize_ref(got.flatten(0, 1)[slots[slots >= 0]], flat_scales)
        bound = 0.01 if kv_cache_dtype == "int8" else 0.08      # e4m3 keeps 3 mantissa bits
        assert ((stored - x[slots >= 0].float()).norm() / x.float().norm()) < bound


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
@pytest.mark.parametrize("block_size", [16, 128])
def test_prompt_store_writes_what_the_token_store_writes(kv_cache_dtype, block_size):
    """A prefill step's store goes by aligned windows of each sequence's positions (store_prompt_kv): the
    cache must be bit for bit what one program per token writes at slot_mapping, and nothing else may change.
    Fresh prompts, a prefix-cache hit and a later chunk that start mid-window, a window's single token, a
    prompt of exactly one block."""
    query_lens, context_lens = [70, 5, 1, 33, block_size], [70, 40, 19, 100, block_size]
    _, cache, meta = make_case(query_lens, context_lens, 4, 2, 32, block_size, torch.float16, DEVICE,
                               kv_cache_dtype=kv_cache_dtype)
    slots = slots_for(meta, block_size, query_lens)
    qkv = torch.randn(len(slots), 3, 2, 32, dtype=torch.float16, device=DEVICE) * 3
    k, v = qkv[:, 0], qkv[:, 1]                        # strided views, as the model's fused qkv gives them
    caches = []
    for store in (lambda c: store_kv(k, v, c, slots), lambda c: store_prompt_kv(k, v, c, meta)):
        copy = LayerKVCache(*(t.clone() if t is not None else None
                              for t in (cache.k, cache.v, cache.k_scale, cache.v_scale)))
        store(copy)
        caches.append([t for t in (copy.k, copy.v, copy.k_scale, copy.v_scale) if t is not None])
    for by_token, by_window, before in zip(*caches, [cache.k, cache.v, cache.k_scale, cache.v_scale]):
        assert torch.equal(by_window.float(), by_token.float())
        assert not torch.equal(by_window.float(), before.float())


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_quantize_round_trip_error_bound(kv_cache_dtype):
    x = torch.randn(64, 8, 128) * torch.rand(64, 8, 1) * 10
    q, scale = quantize_ref(x, kv_cache_dtype)
    err = (dequantize_ref(q, scale) - x).abs()
    amax = x.abs().amax(-1, keepdim=True)
    if kv_cache_dtype == "int8":
        assert (err <= amax / 127 / 2 + 1e-6).all()           # half a step of max|x| / 127
    else:
        assert (err <= x.abs() * 2 ** -4 + amax / 448 * 2 ** -9 + 1e-6).all()   # e4m3: 3 mantissa bits
    assert ((dequantize_ref(q, scale) - x).norm() / x.norm()) < (0.01 if kv_cache_dtype == "int8" else 0.05)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_quantized_cache_stores_v_in_key_groups_and_never_nan(kv_cache_dtype):
    """A quantized V is [blocks, kv_heads, block_size // 64, head_dim, 64] and starts zeroed; the store puts a
    token's values 64 apart, its scales head-major, and NaN input as 0 (the kernels read V past a sequence's
    end unmasked; the CPU interpreter's fp8 conversion never makes NaN, the GPU's does)."""
    torch.manual_seed(0)
    (cache,) = allocate(1, (3, 128, 2, 32), kv_cache_dtype, torch.float16, DEVICE)
    assert cache.v.shape == (3, 2, 2, 32, 64) and cache.v.is_contiguous() and not cache.v.float().any()
    assert cache.v_scale.shape == (3, 128, 2) and cache.v_scale.transpose(1, 2).is_contiguous()
    k, v = torch.randn(2, 2, 2, 32, dtype=torch.float16, device=DEVICE)
    v[1, 0, 5] = float("nan")
    store_kv(k, v, cache, torch.tensor([129, 344], device=DEVICE))       # block 1 row 1, block 2 row 88
    assert not cache.v.float().isnan().any() and not cache.k.float().isnan().any()
    stored = dequantize_ref(cache.v[1, :, 0, :, 1], cache.v_scale[1, 1])  # token 0's [kv_heads, head_dim]
    assert rel_err(stored, v[0]) < (0.01 if kv_cache_dtype == "int8" else 0.08)   # e4m3: 3 mantissa bits
    assert torch.equal(cache.v_slots[2, 88].float(), cache.v[2, :, 1, :, 24].float())
    assert cache.v[2, :, 1, :, 24].float().any()
    scale_storage = cache.v_scale.transpose(1, 2)                          # [blocks, kv_heads, block_size]
    assert (scale_storage[2, :, 88] != 1).all() and (scale_storage[2, :, 87] == 1).all()
    written = torch.zeros(3, 128, dtype=torch.bool, device=DEVICE)
    written[1, 1] = written[2, 88] = True
    assert cache.v_slots.float()[~written].abs().sum() == 0             # nothing else written


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_prefill_masks_keys_at_the_tile_edges(kv_cache_dtype):
    """Chunks whose first query sits just before, at and just after a key-tile edge (a prefix hit or a later
    chunk): key tiles that end before the first query run without the causal mask, so one key too many
    there would leak a future key into the chunk's first rows. Checked row by row."""
    from nanovllm.attention.triton_prefill import prefill_settings
    head_dim = HEAD_DIMS[-1]
    _, cache, _ = make_case([1], [1], 4, 2, head_dim, 16, DTYPES[0], DEVICE, kv_cache_dtype=kv_cache_dtype)
    edge = prefill_settings(cache, head_dim, 64)["block_n"]
    query_lens = [10, 9, 11, 1, 8]                                  # first positions edge-2, -1, -3, -1, +0
    q, cache, meta = make_case(query_lens, [edge + 8] * 3 + [edge, edge + 8], 4, 2, head_dim, 16, DTYPES[0],
                               DEVICE, kv_cache_dtype=kv_cache_dtype)
    out = prefill_attention(q, cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q, 64, 0.1)
    ref = paged_attention_ref(q, cache, meta, 0.1)
    row_err = (out.float() - ref.float()).flatten(1).norm(dim=1) / ref.float().flatten(1).norm(dim=1)
    assert row_err.max() < TOL[DTYPES[0]]


@pytest.mark.parametrize("dtype, heads, kv_cache_dtype, head_dim, block_size, shape",
                         grid([GQA, KV_DTYPES], [HEAD_DIMS, BLOCK_SIZES, PREFILL_SHAPES]))
def test_prefill_matches_reference(dtype, heads, head_dim, block_size, shape, kv_cache_dtype):
    query_lens, context_lens = shape
    q, cache, meta = make_case(query_lens, context_lens, *heads, head_dim, block_size, dtype, DEVICE,
                               kv_cache_dtype=kv_cache_dtype)
    scale = head_dim ** -0.5
    out = prefill_attention(q, cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q, meta.max_seqlen_q,
                            scale)
    ref = paged_attention_ref(q, cache, meta, scale)
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype, heads, num_splits, kv_cache_dtype, head_dim, block_size, context_lens",
                         grid([GQA, [1, 4], KV_DTYPES], [HEAD_DIMS, BLOCK_SIZES, DECODE_SHAPES]))
def test_decode_matches_reference(dtype, heads, head_dim, block_size, context_lens, num_splits, kv_cache_dtype):
    q, cache, meta = make_case([1] * len(context_lens), context_lens, *heads, head_dim, block_size, dtype, DEVICE,
                               kv_cache_dtype=kv_cache_dtype)
    scale = head_dim ** -0.5
    out = decode_attention(q, cache, meta.block_tables, meta.context_lens, scale, num_splits)
    ref = paged_attention_ref(q, cache, meta, scale)
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_decode_launch_order_changes_nothing_but_the_order(num_splits, kv_cache_dtype):
    context_lens = [40, 1, 95, 17, 64]
    q, cache, meta = make_case([1] * len(context_lens), context_lens, 4, 2, HEAD_DIMS[-1], BLOCK_SIZES[0],
                               DTYPES[0], DEVICE, kv_cache_dtype=kv_cache_dtype)
    order = decode_order(context_lens)
    assert order.tolist() == [2, 4, 0, 3, 1]
    ordered = decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, num_splits,
                               order=torch.from_numpy(order).to(DEVICE))
    assert rel_err(ordered, paged_attention_ref(q, cache, meta, 0.1)) < TOL[DTYPES[0]]
    plain = decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, num_splits)
    torch.testing.assert_close(ordered, plain, rtol=0, atol=0)


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_decode_leaves_rows_of_context_0_unwritten(num_splits, kv_cache_dtype):
    """A mixed graph's decode launch covers prefill rows with context 0; the prefill kernel writes those, so
    the decode kernel (and its combine step) leaves them alone, whichever launch runs last."""
    context_lens = [40, 0, 95, 0, 17]
    q, cache, meta = make_case([1] * len(context_lens), context_lens, 4, 2, HEAD_DIMS[-1], BLOCK_SIZES[0],
                               DTYPES[0], DEVICE, kv_cache_dtype=kv_cache_dtype)
    out = torch.full_like(q, 7.0)
    decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, num_splits, out=out)
    assert (out[[1, 3]] == 7.0).all()
    rows = [0, 2, 4]
    assert rel_err(out[rows], paged_attention_ref(q, cache, meta, 0.1)[rows]) < TOL[DTYPES[0]]


def test_split_count_fills_the_gpu_and_is_a_power_of_two():
    assert num_decode_splits(1, 8, 8192) == 32
    assert num_decode_splits(256, 8, 8192) == 1
    assert num_decode_splits(4, 8, 100) == 1
    n = num_decode_splits(8, 8, 4096)
    assert n & (n - 1) == 0 and n > 1


# block_n 16 = block_size 16: each tile lies inside one cache block (load_kv_tile's one-lookup branch)
LAUNCH_SETTINGS = [{"block_n": 16, "num_warps": 2, "num_stages": 2}, {"block_n": 32, "num_warps": 2, "num_stages": 2},
                   {"block_n": 128, "num_warps": 8, "num_stages": 4}, {"block_n": 64, "num_warps": 2, "num_stages": 3},
                   {"block_n": 256, "num_warps": 4, "num_stages": 1}]   # the last: head_dim 64's tiles
HEADS = [(8, 2), (4, 4)]


# every setting with every KV cache dtype; the two head layouts in turn, so each meets every setting and dtype
@pytest.mark.parametrize("settings, kv_cache_dtype, heads", [
    (settings, kv, HEADS[(i + j) % len(HEADS)]) for j, kv in enumerate(KV_DTYPES)
    for i, settings in enumerate(LAUNCH_SETTINGS)])
def test_decode_launch_settings_do_not_change_results(settings, kv_cache_dtype, heads):
    q, cache, meta = make_case([1] * 3, [1, 200, 77], *heads, HEAD_DIMS[-1], BLOCK_SIZES[0], DTYPES[0], DEVICE,
                               kv_cache_dtype=kv_cache_dtype)
    out = decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, 2, settings)
    assert rel_err(out, paged_attention_ref(q, cache, meta, 0.1)) < TOL[DTYPES[0]]


def test_tuned_settings_are_read_per_gpu_model(tmp_path, monkeypatch):
    import json

    from nanovllm.attention import triton_decode
    monkeypatch.setattr(triton_decode, "TUNED_DIR", str(tmp_path))
    triton_decode.tuned_table.cache_clear()
    best = {"int8": {"block_n": 128, "num_warps": 8, "num_stages": 2}}
    with open(triton_decode.tuned_settings_path("Some GPU"), "w") as f:
        json.dump({"settings": best}, f)
    assert triton_decode.tuned_settings("Some GPU") == best
    assert triton_decode.tuned_settings("Other GPU") == {}
    triton_decode.tuned_table.cache_clear()


def test_launches_of_many_programs_take_their_own_tuned_settings():
    from nanovllm.attention.triton_decode import DEFAULT_SETTINGS, pick_settings
    few, many = {"block_n": 128, "num_warps": 4, "num_stages": 2}, {"block_n": 64, "num_warps": 2, "num_stages": 3}
    most = {"block_n": 32, "num_warps": 2, "num_stages": 2}
    table = {"settings": {"int8": few, "fp8": few},
             "many_programs": {"int8": [{"min_programs_per_sm": 6, **many}, {"min_programs_per_sm": 12, **most}]}}
    assert pick_settings(table, "int8", 5.9) == few
    assert pick_settings(table, "int8", 6) == many
    assert pick_settings(table, "int8", 11.9) == many
    assert pick_settings(table, "int8", 12) == most
    assert pick_settings(table, "fp8", 100) == few
    assert pick_settings(table, "auto", 100) == DEFAULT_SETTINGS
    assert pick_settings({}, "int8", 100) == DEFAULT_SETTINGS


def test_a_head_dim_takes_its_own_tuned_entry_or_tiles_of_the_same_bytes():
    """Settings measured at head_dim 128 apply at head_dim 64 with twice the keys per tile (the tile's bytes
    and fixed cost stay those measured), unless the file holds head_dim 64's own measurements."""
    from nanovllm.attention.triton_decode import DEFAULT_SETTINGS, MAX_BLOCK_N, pick_settings
    few, many = {"block_n": 128, "num_warps": 4, "num_stages": 2}, {"block_n": 64, "num_warps": 2, "num_stages": 3}
    table = {"settings": {"int8": few}, "many_programs": {"int8": [{"min_programs_per_sm": 6, **many}]}}
    assert pick_settings(table, "int8", 1, 128) == few
    assert pick_settings(table, "int8", 1, 64) == {**few, "block_n": 256}
    assert pick_settings(table, "int8", 8, 64) == {**many, "block_n": 128}
    assert pick_settings(table, "int8", 8, 256) == {**many, "block_n": 32}
    assert pick_settings(table, "int8", 1, 32)["block_n"] == MAX_BLOCK_N
    assert pick_settings({}, "auto", 1, 64) == {**DEFAULT_SETTINGS, "block_n": 128}
    own = {"block_n": 64, "num_warps": 8, "num_stages": 4}
    table["by_head_dim"] = {"64": {"settings": {"int8": own}}}
    assert pick_settings(table, "int8", 8, 64) == own                 # measured: taken as it is, no tiers
    assert pick_settings(table, "auto", 8, 64) == DEFAULT_SETTINGS      # its entry lacks auto: the defaults
    assert pick_settings(table, "int8", 8, 128) == many


def test_int8_dots_round_the_query_and_probabilities_as_the_reference_does():
    """INT8 cache: both kernels round q and P to INT8 as paged_attention_ref does (64-key tiles), and the test
    can tell: attention on the plain dequantized cache is ~10,000x further off."""
    from nanovllm.attention.torch_ref import attention_ref, gather_kv
    q, cache, meta = make_case([1, 1, 1], [1, 200, 77], 8, 2, 32, 64, torch.float32, DEVICE,
                               kv_cache_dtype="int8")
    settings = {"block_n": 64, "num_warps": 2, "num_stages": 2}
    decode = decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, 1, settings)
    prefill = prefill_attention(q, cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q, 1, 0.1)
    plain = torch.cat([attention_ref(q[i:i + 1], gather_kv(cache.k, cache.k_scale, meta.block_tables[i], n),
                                     gather_kv(cache.v_slots, cache.v_scale, meta.block_tables[i], n), 0.1)
                       for i, n in enumerate(meta.context_lens_cpu)])
    ref = paged_attention_ref(q, cache, meta, 0.1)
    assert rel_err(decode, ref) < 1e-5 < rel_err(decode, plain) / 10      # measured: 5e-8 and 1.2e-3
    assert rel_err(prefill, ref) < 1e-5                                     # 64-key tiles at head_dim 32


@triton.jit
def _round_rows_kernel(x_ptr, q_ptr, scale_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    q8, scale = round_rows_to_int8(tl.load(x_ptr + offs))
    tl.store(q_ptr + offs, q8)
    tl.store(scale_ptr + tl.arange(0, ROWS), scale)


def test_int8_rounding_by_the_float_adder_is_half_to_even():
    """round_rows_to_int8 keeps the low byte of y + 1.5 * 2^23: exact ties go to the even integer (as
    torch.round and the reference do), negative values come out in two's complement, a row's max |x| is
    +-127 and a row of zeros stays 0."""
    from nanovllm.attention.torch_ref import round_rows_to_int8_ref
    ties = [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, -126.5, 125.5, -127.0, 64.5, -3.5, 0.0, 7.5, -0.49]
    x = torch.stack([torch.tensor(ties), torch.randn(16, generator=torch.Generator().manual_seed(0)) * 5,
                     torch.zeros(16), -torch.tensor(ties) / 4]).to(DEVICE)
    q = torch.empty(x.shape, dtype=torch.int8, device=DEVICE)
    scale = torch.empty(4, device=DEVICE)
    _round_rows_kernel[(1,)](x, q, scale, ROWS=4, COLS=16)
    assert q[0].tolist() == [127, 0, 2, 2, 0, -2, -2, 3, -126, 126, -127, 64, -4, 0, 8, 0]
    assert q.abs().amax(1).tolist() == [127, 127, 0, 127]
    want = round_rows_to_int8_ref(x)
    torch.testing.assert_close(q.float() * scale[:, None], want, rtol=1e-6, atol=0)
