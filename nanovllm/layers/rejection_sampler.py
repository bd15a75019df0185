"""Verifying draft tokens (speculative decoding): which guesses the target model keeps, and the token after.

A sequence with d drafts runs d + 1 positions in one forward: its last real token and the drafts. The
logits at position i give the target distribution p_i of the token after it, to compare with draft i.
Drafts from prompt lookup are certain guesses (a one-hot proposal q), so the standard rule (Leviathan et
al., Chen et al.: accept with probability min(1, p/q), on rejection sample from max(0, p - q)) becomes:
  accept draft i with probability p_i(draft i); at the first rejection, sample from p_i with the draft's
  token removed; if all d are accepted, sample one more token from p_d.
The tokens that come out are distributed exactly as sampling without speculation would give. p is the
distribution the sampler draws from (temperature, top-k, top-p, min-p applied); for a greedy request it is
one-hot at the argmax, so greedy output is identical to decoding without drafts.
"""
from itertools import accumulate

import torch

from nanovllm.layers.sampler import SamplingTensors, filter_probs, inverse_cdf, softmax_at, uniforms


def target_probs(logits: torch.Tensor, params: SamplingTensors, rows: torch.Tensor) -> torch.Tensor:
    """The sampling distribution at every position [P, vocab] float32; rows [P]: each position's row in params."""
    temperatures = params.temperatures[rows]
    probs = softmax_at(logits, temperatures)
    if params.needs_filter:
        probs = filter_probs(probs, params.top_ks[rows], params.top_ps[rows], params.min_ps[rows])
        probs = probs / probs.sum(dim=-1, keepdim=True)      # what is kept, renormalized
    greedy = temperatures == 0
    if greedy.any():
        one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


def verify(logits: torch.Tensor, drafts: list[list[int]], params: SamplingTensors) -> list[list[int]]:
    """logits [sum(len(d) + 1), vocab]: each row's positions in turn; drafts[r]: row r's guesses. Returns
    for every row its accepted drafts followed by one new token."""
    counts = [len(d) + 1 for d in drafts]
    starts = [0, *accumulate(counts)][:-1]      # each row's first position
    device = logits.device
    if params.all_greedy:    # acceptance is a comparison with the argmax
        target = logits.argmax(dim=-1).tolist()
        accepted = [[t == target[s + i] for i, t in enumerate(d)] for d, s in zip(drafts, starts)]
    else:
        rows = torch.repeat_interleave(torch.arange(len(drafts), device=device), torch.tensor(counts, device=device))
        probs = target_probs(logits, params, rows)
        # each position's draft (the next position's input), -1 at a row's last position (no draft to check)
        guess = torch.tensor([t for d in drafts for t in d + [-1]], device=device)
        p_guess = probs.gather(1, guess.clamp(min=0)[:, None])[:, 0]
        position_gens = [params.generators[r] for r, n in enumerate(counts) for _ in range(n)]
        flat = (1.0 - uniforms(len(guess), position_gens, device) < p_guess).tolist()      # u in [0, 1)
        accepted = [flat[s:s + len(d)] for d, s in zip(drafts, starts)]
    kept = [next((i for i, ok in enumerate(a) if not ok), len(a)) for a in accepted]
    finals = [s + k for s, k in zip(starts, kept)]
    if params.all_greedy:
        return [d[:k] + [target[f]] for d, k, f in zip(drafts, kept, finals)]
    residual = probs[finals]
    rejected = [(r, d[k]) for r, (d, k) in enumerate(zip(drafts, kept)) if k < len(d)]
    if rejected:     # sample from p without the rejected draft's token
        index = torch.tensor(rejected, device=device)
        residual[index[:, 0], index[:, 1]] = 0.0
    new = inverse_cdf(residual, uniforms(len(drafts), params.generators, device)).tolist()
    return [d[:k] + [t] for d, k, t in zip(drafts, kept, new)]
