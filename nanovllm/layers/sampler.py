"""Sampling the next token of every sequence in one batched pass.

Rows with temperature 0 take the argmax of the raw logits. Other rows: divide by temperature, softmax,
keep the top-k, the smallest set whose probability reaches top-p, and the tokens with probability at
least min_p times the largest; then draw by inverse CDF: one uniform u in (0, 1] per row, and the token
where the cumulative probability first reaches u times the row's total. A request with a seed draws its
u from its own generator, so its tokens do not depend on the rest of the batch.
Without filters, on CUDA, triton_sampler.py draws the same way while reading the logits once;
`sample_ref` is what it computes.
"""
from dataclasses import dataclass

import torch


@dataclass
class SamplingTensors:
    """Per-row sampling settings on the logits' device."""
    temperatures: torch.Tensor   # [num_seqs] float32, 0 = greedy
    top_ks: torch.Tensor         # [num_seqs] float32 holding integers, vocab size = off
    top_ps: torch.Tensor         # [num_seqs] float32
    min_ps: torch.Tensor         # [num_seqs] float32
    generators: list             # torch.Generator or None per row
    needs_filter: bool           # any row uses top-k, top-p or min-p
    all_greedy: bool


def filter_probs(probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor,
                 min_ps: torch.Tensor) -> torch.Tensor:
    """Zero the probabilities outside each row's top-k / top-p / min-p set (the top token always stays)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = ranks >= top_ks[:, None]
    drop |= mass_before >= top_ps[:, None]
    drop |= sorted_probs < min_ps[:, None] * sorted_probs[:, :1]
    drop[:, 0] = False
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def uniforms(num_rows: int, generators: list, device) -> torch.Tensor:
    """One u in (0, 1] per row: from the row's own generator where it has one."""
    u = 1.0 - torch.rand(num_rows, device=device)
    for row, gen in enumerate(generators):
        if gen is not None:
            u[row] = 1.0 - torch.rand(1, device=device, generator=gen)
    return u


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs [num_seqs, vocab] (unnormalized, >= 0), u [num_seqs] in (0, 1] -> the first token whose
    cumulative probability reaches u times the row's total; a token of probability 0 is never chosen."""
    cdf = probs.cumsum(dim=-1)
    return torch.searchsorted(cdf, (u * cdf[:, -1])[:, None])[:, 0]


def softmax_at(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """softmax(logits / T) per row in float32 (T = 0 rows come out near one-hot; callers take the argmax)."""
    return torch.softmax(logits.float() / temperatures.clamp(min=1e-5)[:, None], dim=-1)


def sample_ref(logits: torch.Tensor, temperatures: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """argmax where the temperature is 0, else the inverse-CDF draw at u from softmax(logits / T)."""
    return torch.where(temperatures == 0, logits.argmax(dim=-1), inverse_cdf(softmax_at(logits, temperatures), u))


class Sampler:
    """logits [num_seqs, vocab] -> token ids [num_seqs]."""

    def __call__(self, logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        if params.all_greedy:
            return logits.argmax(dim=-1)
        u = uniforms(logits.shape[0], params.generators, logits.device)
        if not params.needs_filter:
            if logits.is_cuda:
                from nanovllm.layers.triton_sampler import sample
                return sample(logits, params.temperatures, u)
            return sample_ref(logits, params.temperatures, u)
        probs = filter_probs(softmax_at(logits, params.temperatures), params.top_ks, params.top_ps, params.min_ps)
        return torch.where(params.temperatures == 0, logits.argmax(dim=-1), inverse_cdf(probs, u))
