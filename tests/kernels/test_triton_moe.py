"""The fused MoE kernels (token sorting, grouped gate_up GEMM with SiLU-and-multiply, grouped down GEMM)
against fused_moe_ref."""
import pytest
import torch

from nanovllm.layers.moe import fused_moe_ref, select_experts

triton = pytest.importorskip("triton")
from nanovllm.layers.triton_moe import fused_moe, moe_align, route  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.bfloat16, torch.float16, torch.float32] if CUDA else [torch.float32]   # float32: no TF32
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=2e-3, rtol=2e-2),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
# (tokens, experts, top_k, hidden, intermediate): Qwen3-30B-A3B's layer on a GPU (128 experts, top 8,
# 2048 hidden, 768 intermediate), tiny ones in the interpreter; up to PER_PAIR_MAX_PAIRS (token, slot) pairs
# take the unsorted decode path (5 x 2 pairs over 8 experts: some pairs share an expert)
SHAPES = ([(1, 128, 8, 2048, 768), (2, 128, 8, 2048, 768), (7, 128, 8, 2048, 768), (300, 128, 8, 2048, 768),
           (64, 8, 2, 512, 320)] if CUDA
          else [(1, 4, 2, 64, 32), (5, 8, 2, 64, 48), (40, 4, 3, 32, 80)])


def moe_case(num_tokens, num_experts, top_k, hidden, inter, dtype):
    """(x, w13, w2, router weights, expert ids) of one layer, random, at unit-scale outputs."""
    x = torch.randn(num_tokens, hidden, device=DEVICE).to(dtype)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, device=DEVICE) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, device=DEVICE) / inter ** 0.5).to(dtype)
    weights, ids = select_experts(torch.randn(num_tokens, num_experts, device=DEVICE), top_k, True)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("num_tokens, num_experts, top_k", [(1, 4, 2), (9, 8, 3), (50, 6, 2), (3, 64, 8)])
@pytest.mark.parametrize("block_m", [16, 64])
def test_moe_align_puts_each_pair_once_in_its_experts_block(num_tokens, num_experts, top_k, block_m):
    torch.manual_seed(num_tokens)
    ids = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(num_tokens)]).to(DEVICE)
    sorted_ids, block_experts = moe_align(ids, num_experts, block_m)
    pairs = num_tokens * top_k
    real = sorted_ids[sorted_ids < pairs]
    assert sorted(real.tolist()) == list(range(pairs))                       # every pair exactly once
    for b, expert in enumerate(block_experts.tolist()):
        block = sorted_ids[b * block_m:(b + 1) * block_m]
        inside = block[block < pairs].long()
        if expert < 0:
            assert len(inside) == 0
        else:
            assert len(inside) > 0 and (ids.flatten()[inside] == expert).all()
    used = (block_experts >= 0).sum().item()
    assert used == sum(-(-int((ids == e).sum()) // block_m) for e in range(num_experts))   # no empty block


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, num_experts, top_k, hidden, inter", SHAPES)
def test_fused_moe_matches_reference(dtype, num_tokens, num_experts, top_k, hidden, inter):
    torch.manual_seed(num_tokens + hidden)
    x, w13, w2, weights, ids = moe_case(num_tokens, num_experts, top_k, hidden, inter, dtype)
    got = fused_moe(x, w13, w2, weights, ids)
    want = fused_moe_ref(x.float(), w13.float(), w2.float(), weights, ids).to(dtype)
    torch.testing.assert_close(got, want, **TOL[dtype])


def test_per_pair_and_sorted_paths_give_the_same_rows(monkeypatch):
    """Where the sort starts (per_pair_max) moves pairs between blocks, never what a row computes."""
    from nanovllm.layers import triton_moe
    sorts = []
    monkeypatch.setattr(triton_moe, "moe_align", lambda *args: sorts.append(args) or moe_align(*args))
    torch.manual_seed(4)
    num_tokens, num_experts, top_k, hidden, inter = (9, 128, 8, 2048, 768) if CUDA else (9, 8, 3, 64, 48)
    dtype = DTYPES[0]
    x, w13, w2, weights, ids = moe_case(num_tokens, num_experts, top_k, hidden, inter, dtype)
    sorted_rows = fused_moe(x, w13, w2, weights, ids, per_pair_max=0)
    per_pair = fused_moe(x, w13, w2, weights, ids, per_pair_max=num_tokens * top_k)
    assert len(sorts) == 1                                  # only the first call sorted
    torch.testing.assert_close(per_pair, sorted_rows, **TOL[dtype])


@pytest.mark.parametrize("num_tokens, num_experts, top_k", [(1, 128, 8), (37, 128, 8), (5, 60, 4), (3, 8, 2)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_route_matches_select_experts(num_tokens, num_experts, top_k, renormalize, dtype):
    """The one-launch router: the same experts, largest first, and the same weights as select_experts.
    Logits are distinct and exact in every dtype (multiples of 1/16): ties may order differently in topk."""
    torch.manual_seed(num_tokens * num_experts)
    logits = torch.stack([torch.randperm(num_experts) for _ in range(num_tokens)]) / 16 - num_experts / 32
    logits = logits.to(DEVICE, dtype)
    weights, ids = route(logits, top_k, renormalize)
    want_weights, want_ids = select_experts(logits, top_k, renormalize)
    assert ids.dtype == torch.int32 and torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-6)


def test_route_names_a_valid_expert_for_nan_logits():
    """A padding row of a CUDA graph may carry NaN; its expert ids must still index the weights."""
    logits = torch.full((2, 8), float("nan"), device=DEVICE)
    logits[1] = torch.arange(8.0)
    _, ids = route(logits, 2, True)
    assert ids.min() >= 0 and ids.max() < 8 and ids[1].tolist() == [7, 6]


@pytest.mark.parametrize("down_sum", [(16, 16, 4, 3), (32, 64, 2, 2), (16, 256, 4, 3)])
def test_down_and_the_sum_in_one_launch_equal_them_apart(down_sum):
    """Decode's fused down GEMM + top_k sum (several K tiles per expert, a partial last column tile) gives
    the rows of the down GEMM and the sum run apart, and the reference's."""
    torch.manual_seed(7)
    num_tokens, num_experts, top_k, hidden, inter = (2, 128, 8, 2048, 768) if CUDA else (2, 8, 3, 40, 48)
    dtype = DTYPES[0]
    x, w13, w2, weights, ids = moe_case(num_tokens, num_experts, top_k, hidden, inter, dtype)
    gate_up = (32, 64, 4, 3)
    fused = fused_moe(x, w13, w2, weights, ids, {"gate_up": gate_up, "down_sum": down_sum})
    apart = fused_moe(x, w13, w2, weights, ids, {"gate_up": gate_up, "down": (64, 64, 4, 3)})
    torch.testing.assert_close(fused, apart, **TOL[dtype])
    want = fused_moe_ref(x.float(), w13.float(), w2.float(), weights, ids).to(dtype)
    torch.testing.assert_close(fused, want, **TOL[dtype])
