"""Sampling the next token of every sequence in one batched pass.

Rows with temperature 0 take the argmax of the raw logits. Other rows: divide by temperature, softmax,
keep the top-k, the smallest set whose probability reaches top-p, and the tokens with probability at
least min_p times the largest; then draw with the exponential-race trick, argmax(p / E) with E ~ Exp(1),
which samples from p without a cumulative sum. A request with a seed draws its E from its own generator,
so its tokens do not depend on the rest of the batch.
"""
from dataclasses import dataclass

import torch

from nanovllm.utils.compile import compile_on_cuda


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


def exponential_noise(shape: tuple[int, int], generators: list, device) -> torch.Tensor:
    noise = torch.empty(shape, device=device).exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    return noise


@compile_on_cuda
def gumbel_argmax(logits: torch.Tensor, temperatures: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(softmax(logits / T) / E) = argmax(logits / T - log E): no softmax pass needed."""
    scaled = logits.float() / temperatures.clamp(min=1e-5)[:, None]
    sampled = (scaled - noise.clamp(min=1e-10).log()).argmax(dim=-1)
    return torch.where(temperatures == 0, logits.argmax(dim=-1), sampled)


class Sampler:
    """logits [num_seqs, vocab] -> token ids [num_seqs]."""

    def __call__(self, logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        if params.all_greedy:
            return logits.argmax(dim=-1)
        if not params.needs_filter:
            noise = exponential_noise(tuple(logits.shape), params.generators, logits.device)
            return gumbel_argmax(logits, params.temperatures, noise)
        logits = logits.float()
        greedy = logits.argmax(dim=-1)
        temps = params.temperatures.clamp(min=1e-5)[:, None]
        probs = torch.softmax(logits / temps, dim=-1)
        if params.needs_filter:
            probs = filter_probs(probs, params.top_ks, params.top_ps, params.min_ps)
        noise = exponential_noise(tuple(probs.shape), params.generators, probs.device)
        sampled = (probs / noise.clamp(min=1e-10)).argmax(dim=-1)
        return torch.where(params.temperatures == 0, greedy, sampled)
