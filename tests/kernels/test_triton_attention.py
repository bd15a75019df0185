"""Triton attention kernels against the plain-PyTorch reference (CPU: interpreter, tiny; GPU: real sizes)."""
import pytest
import torch

from kernels.attention_cases import make_case, slots_for
from nanovllm.attention.torch_ref import paged_attention_ref, store_kv_ref

triton = pytest.importorskip("triton")
from nanovllm.attention.triton_decode import decode_attention, num_decode_splits  # noqa: E402
from nanovllm.attention.triton_prefill import prefill_attention  # noqa: E402
from nanovllm.attention.triton_store import store_kv  # noqa: E402

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


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA[:2])
def test_store_kv_matches_reference(dtype, heads):
    q, k_cache, v_cache, meta = make_case([5, 9], [5, 20], heads[0], heads[1], 32, 16, dtype, DEVICE)
    slots = slots_for(meta, 16, [5, 9])
    slots[2] = -1                                          # padding token: must not be written
    qkv = torch.randn(len(slots), 3 * heads[1] * 32, dtype=dtype, device=DEVICE)
    k, v = qkv[:, :heads[1] * 32].view(-1, heads[1], 32), qkv[:, heads[1] * 32:2 * heads[1] * 32].view(-1, heads[1], 32)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv_ref(k, v, k_ref, v_ref, slots)
    store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("shape", PREFILL_SHAPES)
def test_prefill_matches_reference(dtype, heads, head_dim, block_size, shape):
    query_lens, context_lens = shape
    q, k_cache, v_cache, meta = make_case(query_lens, context_lens, *heads, head_dim, block_size, dtype, DEVICE)
    scale = head_dim ** -0.5
    out = prefill_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q,
                            meta.max_seqlen_q, scale)
    ref = paged_attention_ref(q, k_cache, v_cache, meta, scale)
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("context_lens", DECODE_SHAPES)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_matches_reference(dtype, heads, head_dim, block_size, context_lens, num_splits):
    q, k_cache, v_cache, meta = make_case([1] * len(context_lens), context_lens, *heads, head_dim, block_size,
                                          dtype, DEVICE)
    scale = head_dim ** -0.5
    out = decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale, num_splits)
    ref = paged_attention_ref(q, k_cache, v_cache, meta, scale)
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[dtype]


def test_split_count_fills_the_gpu_and_is_a_power_of_two():
    assert num_decode_splits(1, 8, 8192) == 32
    assert num_decode_splits(256, 8, 8192) == 1
    assert num_decode_splits(4, 8, 100) == 1
    n = num_decode_splits(8, 8, 4096)
    assert n & (n - 1) == 0 and n > 1
