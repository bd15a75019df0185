"""A step launched on the GPU whose sampled ids the host has not read yet (overlapped steps)."""
from dataclasses import dataclass

import torch

from nanovllm.engine.logprobs import StepLogprobs, sampled_dicts
from nanovllm.engine.scheduler import ScheduledBatch


@dataclass
class PendingStep:
    """A step launched on the GPU whose sampled ids the host has not read yet."""
    batch: ScheduledBatch
    token_ids: torch.Tensor          # [len(batch.sample_rows)] on the GPU: the next step reads inputs here
    rows: dict[int, int]             # seq_id -> its entry in token_ids
    host: torch.Tensor               # pinned copy of token_ids, valid once `done` has fired
    done: torch.cuda.Event
    wanted_logprobs: object = None   # (rows, TokenLogprobs) for rows that asked for logprobs

    def collect(self) -> tuple[list[int | None], StepLogprobs]:
        """The sampled id of every batch row (None for a chunk that does not reach its prompt's end)."""
        self.done.synchronize()
        token_ids: list[int | None] = [None] * len(self.batch.seqs)
        for row, token_id in zip(self.batch.sample_rows, self.host.tolist()):
            token_ids[row] = token_id
        return token_ids, StepLogprobs(sampled_dicts(self.wanted_logprobs, self.batch.seqs, token_ids))
