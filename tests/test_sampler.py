"""Sampler: greedy is argmax; top-k/top-p/min-p never leave their set and keep its proportions; seeds."""
import pytest
import torch

from nanovllm.layers.sampler import Sampler, SamplingTensors, filter_probs
from nanovllm.sampling_params import SamplingParams

PROBS = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])


def tensors(n, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, generators=None):
    vocab = len(PROBS)
    return SamplingTensors(
        temperatures=torch.full((n,), temperature), top_ks=torch.full((n,), top_k if top_k > 0 else vocab),
        top_ps=torch.full((n,), top_p), min_ps=torch.full((n,), min_p),
        generators=generators or [None] * n, needs_filter=top_k > 0 or top_p < 1 or min_p > 0,
        all_greedy=temperature == 0)


def draw(n=20000, **kw):
    torch.manual_seed(0)
    logits = PROBS.log().expand(n, -1).clone()
    return Sampler()(logits, tensors(n, **kw))


def frequencies(ids):
    return torch.bincount(ids, minlength=len(PROBS)).float() / len(ids)


def test_greedy_is_argmax():
    logits = torch.randn(16, 50)
    out = Sampler()(logits, SamplingTensors(torch.zeros(16), torch.full((16,), 50), torch.ones(16),
                                            torch.zeros(16), [None] * 16, False, True))
    assert torch.equal(out, logits.argmax(-1))


def test_mixed_greedy_and_sampled_rows():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    t = SamplingTensors(torch.tensor([0.0, 1.0, 0.0, 1.0]), torch.full((4,), 50), torch.ones(4),
                        torch.zeros(4), [None] * 4, False, False)
    out = Sampler()(logits, t)
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_plain_sampling_matches_distribution():
    freq = frequencies(draw())
    assert torch.allclose(freq, PROBS, atol=0.015)


@pytest.mark.parametrize("kw,allowed", [
    (dict(top_k=2), [0, 1]),
    (dict(top_p=0.7), [0, 1, 2]),          # 0.40 + 0.25 < 0.7, so the third token is needed
    (dict(min_p=0.3), [0, 1, 2]),          # p >= 0.3 * 0.40 = 0.12
    (dict(top_k=3, top_p=0.5), [0, 1]),
])
def test_filters_stay_in_their_set_with_renormalized_proportions(kw, allowed):
    freq = frequencies(draw(**kw))
    outside = [i for i in range(len(PROBS)) if i not in allowed]
    assert freq[outside].sum() == 0
    expected = PROBS[allowed] / PROBS[allowed].sum()
    assert torch.allclose(freq[allowed], expected, atol=0.015)


def test_low_temperature_sharpens():
    freq = frequencies(draw(temperature=0.25))
    assert freq[0] > 0.8


def test_filter_keeps_top_token_even_with_tiny_top_p():
    out = filter_probs(PROBS[None], torch.tensor([6]), torch.tensor([1e-6]), torch.tensor([0.0]))
    assert out[0, 0] == PROBS[0] and out[0, 1:].sum() == 0


def test_seeded_rows_reproduce_whatever_the_batch():
    logits = torch.randn(1, 100)

    def sample_with_seed(batch_size, row):
        gens = [None] * batch_size
        gens[row] = torch.Generator().manual_seed(1234)
        batch_logits = torch.randn(batch_size, 100)
        batch_logits[row] = logits[0]
        t = SamplingTensors(torch.ones(batch_size), torch.full((batch_size,), 100), torch.ones(batch_size),
                            torch.zeros(batch_size), gens, False, False)
        return [Sampler()(batch_logits, t)[row].item() for _ in range(1)] + \
            [Sampler()(batch_logits, t)[row].item() for _ in range(5)]

    assert sample_with_seed(1, 0) == sample_with_seed(7, 3)


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_k=-2), dict(top_p=0), dict(top_p=1.5),
                                dict(min_p=2), dict(max_tokens=0), dict(stop=[""]), dict(stop_token_ids=[-1])])
def test_bad_sampling_params_raise(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_temperature_zero_is_allowed_and_greedy():
    assert SamplingParams(temperature=0).greedy
