"""Draft tokens by prompt lookup (n-gram speculation): no draft model, only the sequence itself.

Text that repeats what came before (code edited in place, a quoted document, a list that continues a
pattern) is predictable from its own history: if the last n tokens occurred earlier, the tokens that
followed them then are a good guess for what follows now. The proposer tries n from prompt_lookup_max down
to prompt_lookup_min and takes the most recent earlier occurrence of the longest suffix that has one.
The target model then checks all guesses in one forward (layers/rejection_sampler.py).
"""
import weakref

import numpy as np


def propose_ngram(token_ids, num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to num_tokens draft ids continuing token_ids, or [] when no suffix of min_n..max_n tokens
    occurred earlier.

    Candidates are the earlier positions j holding the last token; each round keeps those whose token k
    places back also equals the suffix's, so after round n - 1 the survivors end an earlier copy of the
    last n tokens. One vectorized comparison over the sequence, then a few over the survivors."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    length = len(tokens)
    ends = np.flatnonzero(tokens[:length - 1] == tokens[length - 1]) if length > 1 else tokens[:0]
    best = None
    for n in range(1, min(max_n, length - 1) + 1):
        if n > 1:
            back = ends - (n - 1)
            ends = ends[(back >= 0)]
            ends = ends[tokens[ends - (n - 1)] == tokens[length - n]]
        if not len(ends):
            break
        if n >= min_n:
            best = ends[-1]          # the latest earlier copy of the longest suffix so far
    if best is None:
        return []
    return tokens[best + 1:best + 1 + num_tokens].tolist()


class NgramProposer:
    """Draft tokens for the sequences of a decode step, under the engine's speculative_config. Each
    sequence's tokens are kept as a growing array (only new tokens are copied at each step)."""

    def __init__(self, config):
        self.k = config.num_speculative_tokens
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max
        self.max_batch = config.disable_by_batch_size
        self._history: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # Sequence -> (array, length)

    def active(self, num_running: int) -> bool:
        """Speculate in a step of this many running sequences (beyond disable_by_batch_size: no)."""
        return self.max_batch is None or num_running <= self.max_batch

    def propose(self, seq, room: int) -> list[int]:
        """At most min(k, room) drafts for seq; room is what it may still grow by after this step's token."""
        if room <= 0:
            return []
        return propose_ngram(self._tokens(seq), min(self.k, room), self.min_n, self.max_n)

    def _tokens(self, seq) -> np.ndarray:
        ids = seq.token_ids
        array, length = self._history.get(seq, (None, 0))
        if array is None or length > len(ids) or (length and array[length - 1] != ids[length - 1]):
            array, length = np.empty(max(2 * len(ids), 64), dtype=np.int64), 0
        if len(ids) > len(array):
            array = np.concatenate([array[:length], np.empty(len(ids), dtype=np.int64)])
        array[length:len(ids)] = ids[length:]
        self._history[seq] = (array, len(ids))
        return array[:len(ids)]
