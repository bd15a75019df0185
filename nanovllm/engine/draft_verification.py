"""The sampling of a step that carries draft tokens (speculative decoding, engine/ngram.py proposes them)."""
import numpy as np
import torch

from nanovllm.engine.logits_processors import needs_processing, process_logits
from nanovllm.engine.logprobs import sampled_dicts, sampled_logprobs
from nanovllm.engine.scheduler import ScheduledBatch
from nanovllm.layers.rejection_sampler import verify


def sample_with_drafts(batch: ScheduledBatch, logits: torch.Tensor, sampling_tensors, token_ids: list) -> dict:
    """logits [positions, vocab] hold one position per sampled row and 1 + d for a row with d drafts. Each
    drafted row of token_ids gets a list (accepted drafts, then its next token), the others one token;
    returns the logprob dicts of rows that asked. Rows with drafts never use logits processors or logprobs
    (the scheduler gives them none), so those concern single-position rows only. sampling_tensors(seqs):
    the rows' SamplingTensors."""
    rows = batch.sample_rows
    seqs = [batch.seqs[r] for r in rows]
    drafts = [seq.token_ids[len(seq) - seq.num_drafts:] if seq.num_drafts else [] for seq in seqs]
    last = torch.tensor(np.cumsum([len(d) + 1 for d in drafts]) - 1, device=logits.device)
    raw = logits[last]      # each row's last position: the model's own logits, for logprobs
    if needs_processing(seqs):
        logits[last] = process_logits(raw, seqs).to(logits.dtype)
    new_tokens = verify(logits, drafts, sampling_tensors(seqs))
    last_ids: list[int | None] = [None] * len(batch.seqs)
    for row, new in zip(rows, new_tokens):
        token_ids[row] = new if batch.seqs[row].num_drafts else new[0]
        last_ids[row] = new[-1]
    wanted = sampled_logprobs(raw, torch.tensor([new[-1] for new in new_tokens], device=logits.device),
                              batch.seqs, rows)
    return sampled_dicts(wanted, batch.seqs, last_ids)
