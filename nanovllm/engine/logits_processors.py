"""The per-request logits processors of SamplingParams, applied before sampling (vLLM V1's order):
min_tokens, logit_bias, bad_words, then the repetition, frequency and presence penalties.

For output tokens o (counts c_t) and prompt tokens P, row by row:
    min_tokens:  logit[t] = -inf for EOS and stop_token_ids while len(o) < min_tokens
    logit_bias:  logit[t] += bias[t]
    bad_words:   logit[w_last] = -inf when o ends with the word's other tokens w[:-1]
    repetition:  for t in P or o: logit[t] / p if logit[t] > 0 else logit[t] * p   (transformers' rule)
    frequency, presence:  logit[t] -= f * c_t + r * (c_t > 0)
Only the rows that ask for a processor are touched, in plain PyTorch on the logits' device; the step needs
every earlier token on the host, so the engine does not overlap such steps with the next launch.
"""
import torch

from nanovllm.engine.sequence import Sequence


def needs_processing(seqs: list[Sequence]) -> bool:
    return any(seq.processes_logits for seq in seqs)


def process_logits(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """logits [len(seqs), vocab] -> a float32 copy with each row's processors applied."""
    logits = logits.float().clone()
    for row, seq in enumerate(seqs):
        if seq.processes_logits:
            _process_row(logits[row], seq)
    return logits


def _ids(token_ids: list[int], device) -> torch.Tensor:
    return torch.tensor(token_ids, dtype=torch.long, device=device)


def _process_row(logits: torch.Tensor, seq: Sequence) -> None:
    """Apply seq's processors to its row (a view, changed in place)."""
    params, output, device = seq.sampling_params, seq.completion_token_ids, logits.device
    if len(output) < params.min_tokens and seq.min_tokens_banned:
        logits[_ids(seq.min_tokens_banned, device)] = float("-inf")
    if params.logit_bias:
        logits[_ids(list(params.logit_bias), device)] += torch.tensor(list(params.logit_bias.values()),
                                                                      device=device)
    for word in seq.bad_words_ids:
        prefix = word[:-1]
        if len(prefix) <= len(output) and output[len(output) - len(prefix):] == prefix:
            logits[word[-1]] = float("-inf")
    if params.repetition_penalty != 1.0:
        seen = torch.unique(_ids(seq.token_ids, device))
        x = logits[seen]
        logits[seen] = torch.where(x > 0, x / params.repetition_penalty, x * params.repetition_penalty)
    if (params.frequency_penalty or params.presence_penalty) and output:
        counts = torch.bincount(_ids(output, device), minlength=logits.shape[0]).to(logits.dtype)
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
