"""The per-step data every attention layer reads, built once per step by the model runner."""
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
    num_decode_splits: int = 1    # split-KV factor of the decode kernel (fixed per CUDA graph)
    decode_order: torch.Tensor | None = None   # [num_seqs] int32: rows by descending context (launch order)
    tiles: torch.Tensor | None = None          # [capacity, 2] int32 tile map of a prefill/mixed CUDA graph


def decode_order(context_lens) -> np.ndarray:
    """Rows by descending context length (int32): the launch order in which a decode kernel's longest
    programs start first and the short ones fill the gaps (longest-job-first scheduling)."""
    return np.argsort(-np.asarray(context_lens), kind="stable").astype(np.int32)


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
