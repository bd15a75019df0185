"""Continuous batching: which sequences run this step, and how many tokens each.

Every scheduled entry is (seq, num_new_tokens): the step computes tokens
[seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens) of the sequence. One step fills one
token budget (`max_num_batched_tokens`), as vLLM V1 and SGLang do:
1. decodes first: every running sequence gets one token (the newest gives way, preempted, when the cache
   has no block for it);
2. then prefill chunks: waiting sequences (new, or preempted and to be recomputed) take what is left of
   the budget and of the `max_num_seqs` seats, the last one cut to fit (chunked prefill).
A step with both is a mixed step: a newcomer's prompt rides along with the running sequences' decodes
instead of stopping them for a step of its own. Decode rows come first in the batch. A sequence yields a
new token only when its step reaches its last token.
"""
from collections import deque
from dataclasses import dataclass, field

from nanovllm.config import Config
from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """What one step computes: rows 0..num_decodes-1 are decodes (one token each), the rest prefill
    chunks. sample_rows: the rows whose step reaches their sequence's last token (they get a token)."""
    seqs: list[Sequence]
    num_new_tokens: list[int]
    num_decodes: int = 0
    sample_rows: list[int] = field(init=False)

    def __post_init__(self):
        self.sample_rows = [i for i, (seq, n) in enumerate(zip(self.seqs, self.num_new_tokens))
                            if seq.num_computed_tokens + n == len(seq)]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_prefill(self) -> bool:
        """Any prefill chunk in the step (a pure prefill or a mixed step): attention runs varlen."""
        return self.num_decodes < len(self.seqs)

    @property
    def kind(self) -> str:
        """'decode', 'prefill' or 'mixed' (both), for step statistics."""
        if not self.is_prefill:
            return "decode"
        return "mixed" if self.num_decodes else "prefill"


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
        """The next batch: decodes, then prefill chunks, under one token budget. Empty only when every
        running sequence is already known to finish and no waiting one fits."""
        seqs, counts = self._schedule_decodes(self.max_num_batched_tokens)
        num_decodes = len(seqs)
        self._schedule_prefills(self.max_num_batched_tokens - num_decodes, seqs, counts)
        return ScheduledBatch(seqs, counts, num_decodes)

    def _schedule_decodes(self, budget: int) -> tuple[list[Sequence], list[int]]:
        """One token for each running sequence, oldest first, while the budget lasts."""
        seqs, skipped = [], []
        while self.running and len(seqs) < budget:
            seq = self.running.popleft()
            if seq.will_finish:
                skipped.append(seq)   # waits for its in-flight token; nothing more to compute
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
        self.running.extendleft(reversed(seqs + skipped))
        return seqs, [1] * len(seqs)

    def _schedule_prefills(self, budget: int, seqs: list[Sequence], counts: list[int]) -> None:
        """Waiting sequences in order, under the budget and the free seats; the last one may be a chunk."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not seq.block_table:
                if not self.block_manager.can_allocate(seq):
                    break
                self.block_manager.allocate(seq)
            remaining = len(seq) - seq.num_computed_tokens
            num_new = min(remaining, budget)
            self.block_manager.commit(seq, seq.num_computed_tokens + num_new)   # shareable within this step
            seqs.append(seq)
            counts.append(num_new)
            budget -= num_new
            if num_new < remaining:
                break   # the rest of this prompt goes in the next step's chunk
            seq.status = SequenceStatus.RUNNING
            self.running.append(self.waiting.popleft())

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

    def abort(self, seqs: list[Sequence]) -> None:
        """Finish these sequences ('abort') and free their blocks, in one pass over the queues."""
        doomed = {id(seq) for seq in seqs if not seq.is_finished}
        for seq in seqs:
            if id(seq) in doomed:
                seq.status = SequenceStatus.FINISHED
                seq.finish_reason = "abort"
                self.block_manager.forget_unwritten(seq)
                self.block_manager.deallocate(seq)
        self.running = deque(s for s in self.running if id(s) not in doomed)
        self.waiting = deque(s for s in self.waiting if id(s) not in doomed)
