"""Log-probabilities of sampled and prompt tokens, returned as vLLM returns them.

For every generated token (SamplingParams.logprobs=k) and every prompt token after the first
(prompt_logprobs=k): {token_id: logprob} holding the token itself and the k most likely alternatives.
Log-probabilities are log_softmax of the model's raw logits in float32: the distribution the model
produced, before temperature, top-k and top-p. Nothing is computed or copied for requests that do not ask.

Prompt logprobs need the logits of every prompt position, which a prefix-cache hit never computes, so
requests that ask for them skip the prefix cache (vLLM does the same). The logits of position p score
token p + 1; they are computed in slices so a long prompt never holds a [tokens, vocab] float32 tensor.
"""
from dataclasses import dataclass, field

import torch

MAX_LOGPROBS = 20
PROMPT_SLICE = 512   # prompt positions turned into logits at a time


@dataclass
class TokenLogprobs:
    """Logprobs of one token per row, on the device until `to_dicts` reads them."""
    token_lp: torch.Tensor       # [rows] float32
    top_ids: torch.Tensor        # [rows, k]
    top_lp: torch.Tensor         # [rows, k]

    def to_dicts(self, token_ids: list[int], ks: list[int]) -> list[dict[int, float]]:
        token_lp, top_ids, top_lp = self.token_lp.tolist(), self.top_ids.tolist(), self.top_lp.tolist()
        out = []
        for i, (token, k) in enumerate(zip(token_ids, ks)):
            entry = dict(zip(top_ids[i][:k], top_lp[i][:k]))
            entry[token] = token_lp[i]
            out.append(entry)
        return out


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> TokenLogprobs:
    """logits [rows, vocab], token_ids [rows] -> their logprobs and the top-k of each row."""
    lp = logits.float().log_softmax(dim=-1)
    top_lp, top_ids = lp.topk(k, dim=-1) if k > 0 else (lp[:, :0], lp[:, :0].long())
    return TokenLogprobs(lp.gather(1, token_ids[:, None].long())[:, 0], top_ids, top_lp)


@dataclass
class StepLogprobs:
    """What one step yields, by batch row: a sampled token's dict, and prompt dicts from a position on."""
    sampled: dict[int, dict[int, float]] = field(default_factory=dict)
    prompt: dict[int, tuple[int, list[dict[int, float]]]] = field(default_factory=dict)


def sampled_logprobs(logits: torch.Tensor, sampled: torch.Tensor, seqs, sample_rows: list[int]):
    """(batch rows, TokenLogprobs) for the sampled tokens of rows that asked, or None. logits and sampled
    have one row per entry of sample_rows."""
    picked = [i for i, row in enumerate(sample_rows) if seqs[row].sampling_params.logprobs is not None]
    if not picked:
        return None
    k = max(seqs[sample_rows[i]].sampling_params.logprobs for i in picked)
    index = torch.tensor(picked, device=logits.device)
    return [sample_rows[i] for i in picked], token_logprobs(logits[index], sampled[index], k)


def prompt_logprobs(compute_logits, hidden_states: torch.Tensor, batch,
                    cu_seqlens_q: list[int]) -> dict[int, tuple[int, list[dict[int, float]]]]:
    """Prompt-token dicts for the rows of a prefill step that asked: row -> (first position, dicts)."""
    result = {}
    for row, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
        k = seq.sampling_params.prompt_logprobs
        if k is None:
            continue
        start = seq.num_computed_tokens
        stop = min(start + num_new, seq.num_prompt_tokens - 1)      # position p scores token p + 1
        dicts = []
        for lo in range(start, stop, PROMPT_SLICE):
            hi = min(lo + PROMPT_SLICE, stop)
            rows = slice(cu_seqlens_q[row] + lo - start, cu_seqlens_q[row] + hi - start)
            targets = torch.tensor(seq.token_ids[lo + 1:hi + 1], device=hidden_states.device)
            logits = compute_logits(hidden_states[rows])
            dicts += token_logprobs(logits, targets, k).to_dicts(seq.token_ids[lo + 1:hi + 1], [k] * (hi - lo))
        if dicts:
            result[row] = (start + 1, dicts)
    return result


def sampled_dicts(wanted, seqs, token_ids: list[int | None]) -> dict[int, dict[int, float]]:
    """Batch row -> {token: logprob} once the sampled ids are on the host."""
    if wanted is None:
        return {}
    rows, lp = wanted
    ks = [seqs[r].sampling_params.logprobs for r in rows]
    return dict(zip(rows, lp.to_dicts([token_ids[r] for r in rows], ks)))
