"""Mixed steps in the attention backend: decode rows (one query each, first) beside prompt chunks, eagerly
(the decode kernel with first_seq for the prefill kernel) and as a CUDA graph launches them (a tile map for
the prefill kernel, a fixed decode launch with context 0 past the decodes); CPU: interpreter, tiny."""
import dataclasses

import pytest
import torch
from attention_cases import make_case, rel_err

from nanovllm.attention.metadata import decode_order
from nanovllm.attention.torch_ref import paged_attention_ref

triton = pytest.importorskip("triton")
from nanovllm.attention.triton_backend import TritonBackend  # noqa: E402
from nanovllm.attention.triton_prefill import flat_tiles, prefill_attention  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float16
TOL = 3e-2 if CUDA else 2e-2
HEAD_DIM = 128 if CUDA else 64
KV_DTYPES = ["auto", "int8", "fp8"]


def test_flat_tile_map_lists_every_query_tile_then_padding():
    tiles = flat_tiles([1, 40, 16, 17], capacity=10)
    assert tiles.tolist() == [[0, 0], [1, 0], [1, 1], [1, 2], [2, 0], [3, 0], [3, 1], [-1, 0], [-1, 0], [-1, 0]]
    with pytest.raises(AssertionError):
        flat_tiles([40], capacity=2)


# a mixed step: decodes (one query over a long context) beside prompt chunks, one of them after a prefix hit
MIXED_SHAPE = ([1, 1, 1, 37, 5], [90, 3, 41, 37, 60]) if not CUDA else \
    ([1] * 200 + [700, 33], [1500] * 200 + [700, 900])


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
@pytest.mark.parametrize("spare_tiles", [0, 7])
def test_prefill_by_tile_map_matches_reference(kv_cache_dtype, spare_tiles):
    """The launch a CUDA graph captures: a fixed grid over a tile map with padding entries, padding query
    rows past the step's tokens (left unwritten); the step's rows equal the reference."""
    query_lens, context_lens = MIXED_SHAPE
    q, cache, meta = make_case(query_lens, context_lens, 4, 2, HEAD_DIM, 16, DTYPE, DEVICE,
                               kv_cache_dtype=kv_cache_dtype)
    num_tokens = q.shape[0]
    padded = torch.cat([q, torch.randn(5, *q.shape[1:], dtype=q.dtype, device=DEVICE)])
    tiles = flat_tiles(query_lens)
    tiles = torch.from_numpy(flat_tiles(query_lens, len(tiles) + spare_tiles)).to(DEVICE)
    out = prefill_attention(padded, cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q, 0, 0.1,
                            tiles=tiles)
    ref = paged_attention_ref(q, cache, meta, 0.1)
    assert rel_err(out[:num_tokens], ref) < TOL


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
@pytest.mark.parametrize("num_splits", [1, 2])
def test_eager_mixed_step_sends_its_decode_rows_to_the_decode_kernel(kv_cache_dtype, num_splits):
    """An eager mixed step through the backend: the decode rows (first) by the decode kernel, the prompt
    chunks by the prefill kernel from the first chunk on (first_seq), one output; equal to the reference."""
    query_lens, context_lens = MIXED_SHAPE
    num_decodes = query_lens.index(max(query_lens))
    q, cache, meta = make_case(query_lens, context_lens, 4, 2, HEAD_DIM, 16, DTYPE, DEVICE,
                               kv_cache_dtype=kv_cache_dtype)
    order = torch.from_numpy(decode_order(context_lens[:num_decodes])).to(DEVICE)
    meta = dataclasses.replace(meta, num_decodes=num_decodes, num_decode_splits=num_splits, decode_order=order)
    out = TritonBackend().forward(q, cache, meta, 0.1)
    assert rel_err(out, paged_attention_ref(q, cache, meta, 0.1)) < TOL


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
@pytest.mark.parametrize("num_splits", [1, 2])
def test_graph_mixed_step_sends_its_decode_rows_to_the_decode_kernel(kv_cache_dtype, num_splits):
    """A mixed step as its CUDA graph launches it (cuda_graph.MixedGraphs): the decode kernel over the
    graph's first rows, contexts 0 past the decodes (prompt rows and padding: nothing read), then the
    prefill kernel over a tile map without the decode rows, writing the prompt rows after it. Equal to the
    reference on the step's rows."""
    query_lens, context_lens = MIXED_SHAPE
    num_decodes = query_lens.index(max(query_lens))
    q, cache, meta = make_case(query_lens, context_lens, 4, 2, HEAD_DIM, 16, DTYPE, DEVICE,
                               kv_cache_dtype=kv_cache_dtype)
    num_tokens = q.shape[0]
    padded = torch.cat([q, torch.randn(5, *q.shape[1:], dtype=q.dtype, device=DEVICE)])   # the graph's size
    rows = min(len(padded), len(context_lens) + 2)      # min(tokens, max_num_seqs): past the step's sequences
    tables = torch.cat([meta.block_tables, torch.full_like(meta.block_tables[:2], -1)])
    decode_ctx = torch.zeros(rows, dtype=torch.int32, device=DEVICE)
    decode_ctx[:num_decodes] = meta.context_lens[:num_decodes]
    tiles = torch.from_numpy(flat_tiles([0] * num_decodes + query_lens[num_decodes:], 12)).to(DEVICE)
    graph_meta = dataclasses.replace(meta, block_tables=tables, tiles=tiles, num_decode_splits=num_splits,
                                     decode_context_lens=decode_ctx)
    out = TritonBackend().forward(padded, cache, graph_meta, 0.1)
    assert rel_err(out[:num_tokens], paged_attention_ref(q, cache, meta, 0.1)) < TOL
