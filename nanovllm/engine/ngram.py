"""Draft tokens by prompt lookup (n-gram speculation): no draft model, only the sequence itself.

Text that repeats what came before (code edited in place, a quoted document, a list that continues a
pattern) is predictable from its own history: if the last n tokens occurred earlier, the tokens that
followed them then are a good guess for what follows now. The proposer tries n from prompt_lookup_max down
to prompt_lookup_min and takes the most recent earlier occurrence of the longest suffix that has one.
The target model then checks all guesses in one forward (layers/rejection_sampler.py).
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(token_ids, num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to num_tokens draft ids continuing token_ids, or [] when no suffix of min_n..max_n tokens
    occurred earlier."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # windows starting at 0 .. length-n-1: every earlier occurrence, not the suffix itself
        windows = sliding_window_view(tokens[:length - 1], n)
        hits = np.flatnonzero((windows == tokens[length - n:]).all(axis=1))
        if len(hits):
            start = hits[-1] + n
            return tokens[start:start + num_tokens].tolist()
    return []


class NgramProposer:
    """Draft tokens for the sequences of a decode step, under the engine's speculative_config."""

    def __init__(self, config):
        self.k = config.num_speculative_tokens
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max
        self.max_batch = config.disable_by_batch_size

    def active(self, num_running: int) -> bool:
        """Speculate in a step of this many running sequences (beyond disable_by_batch_size: no)."""
        return self.max_batch is None or num_running <= self.max_batch

    def propose(self, token_ids: list[int], room: int) -> list[int]:
        """At most min(k, room) drafts; room is what the sequence may still grow by after this step's token."""
        if room <= 0:
            return []
        return propose_ngram(token_ids, min(self.k, room), self.min_n, self.max_n)
