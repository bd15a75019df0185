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
    device = logits.device
    rows = torch.repeat_interleave(torch.arange(len(drafts), device=device), torch.tensor(counts, device=device))
    if params.all_greedy:    # acceptance is a comparison with the argmax
        target = logits.argmax(dim=-1).tolist()
        out, start = [], 0
        for d, n in zip(drafts, counts):
            a = next((i for i, t in enumerate(d) if t != target[start + i]), len(d))
            out.append(d[:a] + [target[start + a]])
            start += n
        return out
    probs = target_probs(logits, params, rows)
    # each position's draft (the next position's input), -1 at a row's last position (no draft to check)
    guess = torch.tensor([t for d in drafts for t in d + [-1]], device=device)
    p_guess = probs.gather(1, guess.clamp(min=0)[:, None])[:, 0]
    position_gens = [params.generators[r] for r, n in enumerate(counts) for _ in range(n)]
    u = 1.0 - uniforms(len(guess), position_gens, device)           # [0, 1)
    accepted = ((u < p_guess) & (guess >= 0)).tolist()
    finals, rejected, start = [], [], 0
    for d, n in zip(drafts, counts):
        a = next((i for i in range(len(d)) if not accepted[start + i]), len(d))
        finals.append(start + a)
        rejected.append(d[a] if a < len(d) else -1)
        start += n
    final_probs = probs[finals]
    rejected_ids = torch.tensor(rejected, device=device)
    drop = torch.zeros_like(final_probs, dtype=torch.bool).scatter_(1, rejected_ids.clamp(min=0)[:, None], True)
    residual = final_probs.masked_fill(drop & (rejected_ids >= 0)[:, None], 0.0)
    new = inverse_cdf(residual, uniforms(len(drafts), params.generators, device)).tolist()
    return [d[:f - s] + [t] for d, f, s, t in zip(drafts, finals, _starts(counts), new)]


def _starts(counts: list[int]) -> list[int]:
    starts, total = [], 0
    for n in counts:
        starts.append(total)
        total += n
    return starts
