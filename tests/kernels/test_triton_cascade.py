"""Cascade decode (a prefix shared through the cache, read once for its sharers) against the reference,
and the host's plan of which rows share what (CPU: interpreter, tiny; GPU: real sizes)."""
import pytest
import torch
from attention_cases import make_case, rel_err

from nanovllm.attention.metadata import decode_order
from nanovllm.attention.torch_ref import paged_attention_ref

triton = pytest.importorskip("triton")
from nanovllm.attention.triton_decode import decode_attention  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.bfloat16] if CUDA else [torch.float16]
TOL = {torch.float16: 2e-2, torch.bfloat16: 3e-2}
GQA = [(8, 2)] if not CUDA else [(16, 8), (32, 8), (8, 8), (32, 4)]
HEAD_DIMS = [64] if not CUDA else [128]
KV_DTYPES = ["auto", "int8", "fp8"]


# cascade: rows sharing their first blocks (a prefix-cache hit), more rows than one shared-prefix program holds
# (SHARED_ROWS (sequence, head) pairs: 16 rows of 4 heads per KV head on CPU)
CASCADE_CONTEXTS = [40, 33, 70, 35] * 5 + [49] if not CUDA else [4000 + 7 * i for i in range(300)]


# every (KV dtype, split count, shared prefix) on the GPU; on CPU (the interpreter, ~2 s per split) the 8-bit
# caches, whose difference is in loading a tile and not in how the parts combine, only with both on
CASES = [(kind, splits, shared) for kind in KV_DTYPES for splits in (1, 4 if CUDA else 2) for shared in (0, 2)
         if CUDA or kind == "auto" or (splits > 1 and shared)]


@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("kv_cache_dtype, num_splits, shared_blocks", CASES)
def test_cascade_decode_matches_reference(heads, num_splits, shared_blocks, kv_cache_dtype):
    """Decode with a prefix read once for the rows that share it (every third row does not), with and
    without splits and launch order, equals the reference over the same block tables."""
    from nanovllm.attention.metadata import shared_prefix
    block_size = 16 if not CUDA else 256
    shared_blocks = shared_blocks if not CUDA else 15 * (shared_blocks > 0)
    head_dim = HEAD_DIMS[-1]
    q, cache, meta = make_case([1] * len(CASCADE_CONTEXTS), CASCADE_CONTEXTS, *heads, head_dim, block_size, DTYPES[0],
                               DEVICE, kv_cache_dtype=kv_cache_dtype)
    sharers = [i for i in range(len(CASCADE_CONTEXTS)) if i % 3 != 1]
    meta.block_tables[sharers, :shared_blocks] = meta.block_tables[sharers[0], :shared_blocks].clone()
    plan = shared_prefix(meta.block_tables.tolist(), CASCADE_CONTEXTS, block_size)
    assert plan[0] == shared_blocks * block_size and sum(v > 0 for v in plan[2:]) == len(sharers) * (shared_blocks > 0)
    order = torch.from_numpy(decode_order(CASCADE_CONTEXTS)).to(DEVICE)
    out = decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, num_splits, order=order,
                           shared=torch.tensor(plan, dtype=torch.int32, device=DEVICE))
    ref = paged_attention_ref(q, cache, meta, 0.1)
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[DTYPES[0]]


def test_shared_prefix_plan_takes_the_largest_group_and_whole_common_blocks():
    from nanovllm.attention.metadata import shared_prefix
    # rows 0, 1, 3 start with block 5 (common: 5, 6); row 2 shares nothing
    assert shared_prefix([[5, 6, 7, 8], [5, 6, 9, 10], [1, 2, 3], [5, 6, 7, 11]], [64, 64, 40, 60], 16) == \
        [32, 0, 32, 32, 0, 32]
    assert shared_prefix([[5, 6, 7], [5, 6, 7]], [48, 33], 16)[:2] == [32, 0]   # never a newest key's block
    assert shared_prefix([[5, 6], [4, 6]], [30, 30], 16) == [0, 0, 0, 0]
    assert shared_prefix([[5, 6, 7]], [40], 16) == [0, 0, 0]                    # one row: nothing to share
