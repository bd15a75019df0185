"""Continuous batching: which sequences run this step, and how many tokens each.

Every scheduled entry is (seq, num_new_tokens): the step computes tokens
[seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens) of the sequence. A prefill step takes
waiting sequences (new, or preempted and to be recomputed) and cuts the last one to fit
`max_num_batched_tokens` (chunked prefill); a decode step gives every running sequence one token. A
sequence yields a new token only when its step reaches its last token.
"""
from collections import deque
from dataclasses import dataclass

from nanovllm.config import Config
from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """What one step computes."""
    seqs: list[Sequence]
    num_new_tokens: list[int]
    is_prefill: bool

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    """Waiting and running queues over one block manager."""

    def __init__(self, config: Config, num_kvcache_blocks: int):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_manager = BlockManager(num_kvcache_blocks, config.kvcache_block_size,
                                          config.enable_prefix_caching)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.num_preemptions = 0

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> ScheduledBatch:
        """The next batch; empty only when every running sequence is already known to finish."""
        batch = self._schedule_prefill()
        if batch.seqs:
            return batch
        return self._schedule_decode()

    def _schedule_prefill(self) -> ScheduledBatch:
        seqs, counts = [], []
        budget = self.max_num_batched_tokens
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not seq.block_table:
                if not self.block_manager.can_allocate(seq):
                    break
                self.block_manager.allocate(seq)
            remaining = len(seq) - seq.num_computed_tokens
            num_new = min(remaining, budget)
            seqs.append(seq)
            counts.append(num_new)
            budget -= num_new
            if num_new < remaining:
                break   # the rest of this prompt goes in the next step's chunk
            seq.status = SequenceStatus.RUNNING
            self.running.append(self.waiting.popleft())
        return ScheduledBatch(seqs, counts, is_prefill=True)

    def _schedule_decode(self) -> ScheduledBatch:
        seqs, done = [], []
        while self.running and len(seqs) < self.max_num_seqs:
            seq = self.running.popleft()
            if seq.will_finish:
                done.append(seq)      # waits for its in-flight token; nothing more to compute
                continue
            while not self.block_manager.can_append(seq):
                if self.running:
                    self.preempt(self.running.pop())   # the newest request gives way
                else:
                    self.preempt(seq)
                    break
            else:
                self.block_manager.may_append(seq)
                seqs.append(seq)
        self.running.extendleft(reversed(seqs + done))
        return ScheduledBatch(seqs, [1] * len(seqs), is_prefill=False)

    def preempt(self, seq: Sequence) -> None:
        """Free the sequence's blocks; it will be prefilled again over all its tokens (recompute)."""
        self.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.block_manager.deallocate(seq)
        if self.waiting and self.waiting[0].block_table:
            self.waiting.insert(1, seq)   # behind the prompt being chunked, which holds its blocks
        else:
            self.waiting.appendleft(seq)

    def postprocess(self, batch: ScheduledBatch, token_ids: list[int | None]) -> list[Sequence]:
        """Advance counters, register full blocks, append sampled tokens; returns the sequences that
        received a token (token_ids[i] is None for a prefill chunk that does not reach the end)."""
        sampled = []
        for seq, num_new, token_id in zip(batch.seqs, batch.num_new_tokens, token_ids):
            if seq.is_finished:
                continue      # finished while this step was in flight
            seq.num_computed_tokens += num_new
            self.block_manager.commit(seq)
            if token_id is None:
                continue
            seq.append_token(token_id)
            sampled.append(seq)
        return sampled

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.deallocate(seq)
        (self.running if seq in self.running else self.waiting).remove(seq)
