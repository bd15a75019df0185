"""Sampling kernels against `sample_ref`: the same token for the same uniform u, greedy rows as argmax."""
import pytest
import torch

from nanovllm.layers.sampler import sample_ref

triton = pytest.importorskip("triton")
from nanovllm.layers.triton_sampler import sample  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# (vocab, block_v): one chunk, several chunks with a partial last one, Qwen3's vocabulary on the GPU
SHAPES = [(151936, 4096), (50000, 1024)] if CUDA else [(48, 64), (200, 32), (1000, 128)]
ROWS = 256 if CUDA else 24


def temperatures_with_greedy_rows(rows: int) -> torch.Tensor:
    t = torch.rand(rows, device=DEVICE) * 1.5 + 0.05
    t[::5] = 0.0
    return t


def assert_draws_invert_the_cdf(tokens, logits, t, u, tol):
    """Each sampled row's token t has cdf[t - 1] <= u <= cdf[t] in the exact (float64) CDF of
    softmax(logits / T), give or take tol of probability mass (float32 sums round)."""
    rows = (t > 0).nonzero()[:, 0]
    probs = torch.softmax(logits[rows].double() / t[rows, None].double(), dim=-1)
    cdf = probs.cumsum(-1)
    picked = tokens[rows]
    upper = cdf.gather(1, picked[:, None])[:, 0]
    lower = upper - probs.gather(1, picked[:, None])[:, 0]
    target = u[rows].double()
    assert (target >= lower - tol).all() and (target <= upper + tol).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab,block_v", SHAPES)
def test_sample_inverts_the_cdf_as_the_reference_does(dtype, vocab, block_v):
    torch.manual_seed(vocab)
    logits = (torch.randn(ROWS, vocab, device=DEVICE) * 4).to(dtype)
    t = temperatures_with_greedy_rows(ROWS)
    u = 1.0 - torch.rand(ROWS, device=DEVICE)
    u[1], u[2] = 1.0, 1e-7                           # the ends of (0, 1]: the last and first tokens in play
    got, want = sample(logits, t, u, block_v), sample_ref(logits, t, u)
    assert torch.equal(got[t == 0], logits.argmax(-1)[t == 0])
    assert torch.equal(want[t == 0], got[t == 0])
    # the kernel's chunked sums and the reference's single cumulative sum round differently, so the two may
    # pick neighbours when u sits on a boundary; both must be where u falls in the exact CDF
    for tokens in (got, want):
        assert_draws_invert_the_cdf(tokens, logits, t, u, tol=2e-5)


def test_greedy_ties_take_the_first_index_across_chunks():
    logits = torch.zeros(3, 200, device=DEVICE)
    logits[0, [40, 90, 150]] = 5.0                 # in chunks 1, 2 and 4 of 32
    logits[1, [33, 34]] = 5.0
    t = torch.zeros(3, device=DEVICE)
    got = sample(logits, t, torch.ones(3, device=DEVICE), block_v=32)
    assert got.tolist() == [40, 33, 0]


def test_tokens_of_probability_zero_are_never_drawn():
    """Only tokens 5 and 70 are possible: whatever u is, one of them comes out, in proportion 1 : e^2."""
    logits = torch.full((64, 100), -1e4, device=DEVICE)
    logits[:, 5], logits[:, 70] = 0.0, 2.0
    u = torch.linspace(1e-6, 1.0, 64, device=DEVICE)
    got = sample(logits, torch.ones(64, device=DEVICE), u, block_v=32)
    p5 = 1 / (1 + torch.e ** 2)
    assert torch.equal(got, torch.where(u <= p5, 5, 70).to(got.device))
