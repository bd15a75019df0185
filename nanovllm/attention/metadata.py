"""The per-step data every attention layer reads, built once per step by the model runner."""
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the paged KV cache and what each query attends to.

    Sequence i contributes tokens cu_seqlens_q[i]:cu_seqlens_q[i+1] of the flat batch; after this step
    its cache holds context_lens[i] tokens, and its query tokens are the last ones of that context.
    """
    is_prefill: bool
    slot_mapping: torch.Tensor    # [num_tokens] int64: block_id * block_size + offset; -1 = skip (padding)
    context_lens: torch.Tensor    # [num_seqs] int32
    block_tables: torch.Tensor    # [num_seqs, max_num_blocks] int32, -1 past the end
    cu_seqlens_q: torch.Tensor    # [num_seqs + 1] int32
    max_seqlen_q: int
    max_seqlen_k: int
    context_lens_cpu: list[int]   # host copies, so reference code needs no device sync
    cu_seqlens_q_cpu: list[int]
    num_decodes: int = 0          # a mixed step's first rows bring one query each (decodes)
    num_decode_splits: int = 1    # split-KV factor of the decode kernel (fixed per CUDA graph)
    decode_order: torch.Tensor | None = None   # [decode rows] int32: by descending context (launch order)
    tiles: torch.Tensor | None = None          # [capacity, 2] int32 tile map of a prefill/mixed CUDA graph
    decode_context_lens: torch.Tensor | None = None   # a mixed graph's first rows for the decode kernel:
                                                      # [rows] int32, a decode's context or 0 (not a decode)
    shared: torch.Tensor | None = None         # [2 + num_seqs] int32: cascade attention's plan (shared_prefix)


def decode_order(context_lens) -> np.ndarray:
    """Rows by descending context length (int32): the launch order in which a decode kernel's longest
    programs start first and the short ones fill the gaps (longest-job-first scheduling)."""
    return np.argsort(-np.asarray(context_lens), kind="stable").astype(np.int32)


def shared_prefix(block_tables: list[list[int]], context_lens: list[int], block_size: int) -> list[int]:
    """Cascade attention's plan for a decode batch: [L, a sharer's row, then per row L or 0]. The sharers are
    the rows whose tables start with the most common first block; L is the keys their tables hold in the
    same cache blocks (a prefix shared through the prefix cache), whole blocks that never reach a sharer's
    newest key. Sharers' first L keys are read once for all of them."""
    firsts = [t[0] if t else -1 for t in block_tables]
    first = Counter(firsts).most_common(1)[0][0]       # one pass: a step may hold 1,024 rows
    rows = [i for i, f in enumerate(firsts) if f == first and f != -1]
    if len(rows) < 2:
        return [0, 0] + [0] * len(block_tables)
    table = block_tables[rows[0]]
    n = min(min(len(block_tables[i]) for i in rows), (min(context_lens[i] for i in rows) - 1) // block_size)
    for i in rows[1:]:
        if n <= 0:
            break
        other = block_tables[i]
        if other[:n] != table[:n]:
            n = next(k for k in range(n) if other[k] != table[k])
    length = max(n, 0) * block_size
    per_row = [0] * len(block_tables)
    for i in rows:
        per_row[i] = length
    return [length, rows[0]] + per_row


_current: AttentionMetadata | None = None


def get_metadata() -> AttentionMetadata:
    assert _current is not None, "attention runs only inside ModelRunner's forward"
    return _current


@contextmanager
def use_metadata(meta: AttentionMetadata):
    global _current
    previous, _current = _current, meta
    try:
        yield meta
    finally:
        _current = previous
