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

With speculative decoding (config.speculative_config) a decoding sequence may also carry draft tokens,
appended to its token_ids for the step: it computes 1 + d tokens like a short prefill chunk (after the
plain decodes, before the prefill chunks), and postprocess keeps the drafts the model accepted.
"""
from collections import deque
from dataclasses import dataclass, field

from nanovllm.config import Config
from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.ngram import NgramProposer
from nanovllm.engine.sequence import PLACEHOLDER, Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """What one step computes: rows 0..num_decodes-1 are decodes (one token each), the rest prefill
    chunks. sample_rows: the rows whose step reaches their sequence's last token (they get a token)."""
    seqs: list[Sequence]
    num_new_tokens: list[int]
    num_decodes: int = 0
    num_drafted: int = 0     # rows num_decodes .. num_decodes + num_drafted - 1: decodes with drafts
    sample_rows: list[int] = field(init=False)

    def __post_init__(self):
        # a plain decode computes its sequence's last token; the other rows are checked
        d = self.num_decodes
        self.sample_rows = list(range(d)) + [i for i in range(d, len(self.seqs))
                                             if self.seqs[i].num_computed_tokens + self.num_new_tokens[i] ==
                                             len(self.seqs[i])]

    def logit_positions(self, cu_seqlens_q: list[int]) -> list[int]:
        """Token indices whose logits the step needs: each sampled row's last token, and a drafted row's
        positions from its last real token on (one per draft, plus the token after them)."""
        if not self.num_drafted:
            return [cu_seqlens_q[r + 1] - 1 for r in self.sample_rows]
        return [p for r in self.sample_rows
                for p in range(cu_seqlens_q[r + 1] - 1 - self.seqs[r].num_drafts, cu_seqlens_q[r + 1])]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_prefill(self) -> bool:
        """Any row of several tokens (a prefill chunk, or a decode with drafts): attention runs varlen."""
        return self.num_decodes < len(self.seqs)

    @property
    def kind(self) -> str:
        """'decode', 'prefill' or 'mixed' (both), for step statistics (decodes with drafts are decodes)."""
        decodes = self.num_decodes + self.num_drafted
        if decodes == len(self.seqs):
            return "decode"
        return "mixed" if decodes else "prefill"


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
        # Waiting requests are admitted in any step with a free seat (1). A larger value admits them in waves,
        # only once that many seats are free (or nothing runs); bench.py --admission-wave measures it
        self.admit_min_free_seats = 1
        self.max_model_len = config.max_model_len
        spec = config.speculative_config
        self.proposer = NgramProposer(spec) if spec is not None else None

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def wants_drafts(self) -> bool:
        """Whether the next step speculates: its sequences' last tokens must then be known (not in flight)."""
        return (self.proposer is not None and self.proposer.active(len(self.running))
                and any(map(self._may_draft, self.running)))

    @staticmethod
    def _may_draft(seq: Sequence) -> bool:
        """Requests whose tokens go through logits processors or that want logprobs sample one token per step."""
        return not seq.processes_logits and seq.sampling_params.logprobs is None

    def schedule(self) -> ScheduledBatch:
        """The next batch: decodes, then prefill chunks, under one token budget. Empty only when every
        running sequence is already known to finish and no waiting one fits."""
        plain, drafted = self._schedule_decodes(self.max_num_batched_tokens)
        seqs = plain + drafted
        counts = [1] * len(plain) + [1 + seq.num_drafts for seq in drafted]
        self._schedule_prefills(self.max_num_batched_tokens - sum(counts), seqs, counts)
        return ScheduledBatch(seqs, counts, len(plain), len(drafted))

    def _schedule_decodes(self, budget: int) -> tuple[list[Sequence], list[Sequence]]:
        """One token for each running sequence, oldest first, while the budget lasts; with speculation, drafts
        after it where the proposer has some and they fit. Returns (plain decodes, decodes with drafts)."""
        speculate = self.wants_drafts()
        scheduled, skipped = [], []
        while self.running and budget > 0:
            seq = self.running.popleft()
            if seq.will_finish:
                skipped.append(seq)   # waits for its in-flight token; nothing more to compute
                continue
            if speculate:
                self._add_drafts(seq, budget - 1)
            while not self.block_manager.try_append(seq):
                if seq.num_drafts:
                    seq.drop_drafts()                  # guesses never take a block from another request
                elif self.running:
                    self.preempt(self.running.pop())   # the newest request gives way
                else:
                    self.preempt(seq)
                    break
            else:
                scheduled.append(seq)
                budget -= 1 + seq.num_drafts
        self.running.extendleft(reversed(scheduled + skipped))
        if not speculate:
            return scheduled, []
        return [s for s in scheduled if not s.num_drafts], [s for s in scheduled if s.num_drafts]

    def _add_drafts(self, seq: Sequence, budget: int) -> None:
        """Draft tokens for seq from its own history, as many as its max_tokens, max_model_len and the
        step's token budget allow."""
        params = seq.sampling_params
        if not self._may_draft(seq) or seq.token_ids[-1] == PLACEHOLDER:
            return
        room = min(params.max_tokens - seq.num_completion_tokens - 1, self.max_model_len - len(seq) - 1, budget)
        drafts = self.proposer.propose(seq, room)
        if drafts:
            seq.add_drafts(drafts)

    def _schedule_prefills(self, budget: int, seqs: list[Sequence], counts: list[int]) -> None:
        """Waiting sequences in order, under the budget and the free seats; the last one may be a chunk. A
        prompt already being chunked goes on; a new admission waits for admit_min_free_seats free seats."""
        mid_chunk = bool(self.waiting) and bool(self.waiting[0].block_table)   # holds its blocks (preempt)
        if self.running and not mid_chunk and self.max_num_seqs - len(self.running) < self.admit_min_free_seats:
            return
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not seq.block_table:
                if not self.block_manager.allocate(seq):
                    break
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

    def postprocess(self, batch: ScheduledBatch, token_ids: list[int | list[int] | None]) -> list[Sequence]:
        """Advance counters, register full blocks, append sampled tokens; returns the sequences that
        received a token (token_ids[i] is None for a prefill chunk that does not reach the end)."""
        sampled, block_size = [], self.block_manager.block_size
        for seq, num_new, token_id in zip(batch.seqs, batch.num_new_tokens, token_ids):
            num_drafts = len(seq.drop_drafts()) if seq.num_drafts else 0
            if seq.is_finished:
                continue      # finished while this step was in flight
            if token_id is None:
                seq.num_computed_tokens += num_new
                self.block_manager.commit(seq)
                continue
            if not num_drafts:        # the common case: one new token
                seq.num_computed_tokens += num_new
                seq.token_ids.append(token_id)
                if num_new > 1 or seq.num_computed_tokens % block_size == 0:   # a decode fills a block
                    self.block_manager.commit(seq)                              # every block_size steps
                sampled.append(seq)
                continue
            # a row with drafts gets a list: the drafts the model accepted, then its own next token; the
            # K/V computed for the last real token and the accepted drafts stay, the rest is overwritten later
            new = token_id if isinstance(token_id, list) else [token_id]
            seq.num_accepted_tokens += len(new) - 1
            seq.num_computed_tokens += num_new - num_drafts + len(new) - 1
            seq.token_ids += new
            self.block_manager.commit(seq)
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
                seq.drop_drafts()
                seq.status = SequenceStatus.FINISHED
                seq.finish_reason = "abort"
                self.block_manager.forget_unwritten(seq)
                self.block_manager.deallocate(seq)
        self.running = deque(s for s in self.running if id(s) not in doomed)
        self.waiting = deque(s for s in self.waiting if id(s) not in doomed)
