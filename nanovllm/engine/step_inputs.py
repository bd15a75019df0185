"""A step's inputs, built on the host: token ids, positions, cache slots, block tables, context lengths,
cu_seqlens_q, and for a token still in flight (a PLACEHOLDER on the host) the row of the previous step's
sampled ids that holds it. An eager step (ModelRunner.prepare) writes them into new arrays, a CUDA graph
(engine/cuda_graph.py) into its pinned staging buffers; both through `stage_rows`.

At 1,024 running sequences a Python loop over the rows costs milliseconds per step, more than the GPU's
step: block tables and one-token rows (decodes) are written vectorized, only prefill chunks row by row.
"""
from itertools import chain

import numpy as np
import torch

from nanovllm.engine.sequence import PLACEHOLDER, Sequence


def write_block_tables(tables: np.ndarray, block_tables: list[list[int]]) -> None:
    """Ragged block tables into the first rows of `tables` [rows, max_blocks] in one write (the rest of each
    row keeps its value: callers fill -1 first)."""
    lens = np.fromiter(map(len, block_tables), dtype=np.int64, count=len(block_tables))
    flat = np.fromiter(chain.from_iterable(block_tables), dtype=tables.dtype, count=int(lens.sum()))
    rows = np.repeat(np.arange(len(block_tables)), lens)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(lens) - lens, lens)
    tables[rows, cols] = flat


def stage_one_token_rows(seqs: list[Sequence], tables: np.ndarray, ids: np.ndarray, pos: np.ndarray,
                         slots: np.ndarray, src: np.ndarray, prev, block_size: int) -> np.ndarray:
    """Inputs of rows that compute one token each (decodes), rows 0..len(seqs)-1, their block tables already
    in `tables`: the token, its position and cache slot, and for a placeholder token the row of `prev`'s
    sampled ids that holds it (else -1). Returns the rows' context lengths."""
    n = len(seqs)
    start = np.fromiter((seq.num_computed_tokens for seq in seqs), dtype=np.int64, count=n)
    tokens = [seq.token_ids[seq.num_computed_tokens] for seq in seqs]
    ids[:n] = tokens
    pos[:n] = start
    slots[:n] = tables[np.arange(n), start // block_size] * block_size + start % block_size
    src[:n] = -1
    in_flight = [i for i, token in enumerate(tokens) if token == PLACEHOLDER]
    if in_flight:
        src[in_flight] = [prev.rows[seqs[i].seq_id] for i in in_flight]
    return start + 1


def stage_rows(batch, tables: np.ndarray, ids: np.ndarray, pos: np.ndarray, slots: np.ndarray, src: np.ndarray,
               ctx: np.ndarray, cu: np.ndarray, prev, block_size: int) -> None:
    """Every row of a ScheduledBatch: block tables (rows filled with -1 by the caller), then per token the id,
    position, slot and in-flight source (`src`, -1 for a known token), per row the context length after the
    step (`ctx`) and cu_seqlens_q (`cu`, len(seqs) + 1 entries). Decode rows come first, one token each."""
    write_block_tables(tables, [seq.block_table for seq in batch.seqs])
    decodes = batch.num_decodes
    ctx[:decodes] = stage_one_token_rows(batch.seqs[:decodes], tables, ids, pos, slots, src, prev, block_size)
    cu[:decodes + 1] = np.arange(decodes + 1)
    q = decodes
    for i in range(decodes, len(batch.seqs)):     # prefill chunks (and decodes with drafts)
        seq, num_new = batch.seqs[i], batch.num_new_tokens[i]
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
        p = np.arange(start, end)
        ids[q:q + num_new] = seq.token_ids[start:end]
        pos[q:q + num_new] = p
        slots[q:q + num_new] = tables[i, p // block_size] * block_size + p % block_size
        src[q:q + num_new] = -1
        if seq.token_ids[end - 1] == PLACEHOLDER:   # only a sequence's last token is ever one
            src[q + num_new - 1] = prev.rows[seq.seq_id]
        q += num_new
        ctx[i], cu[i + 1] = end, q


def take_in_flight_tokens(input_ids: torch.Tensor, src_rows: torch.Tensor, prev) -> None:
    """On the device, in place: input_ids[i] = prev's sampled id at row src_rows[i] wherever src_rows[i] >= 0."""
    input_ids[:] = torch.where(src_rows >= 0, prev.token_ids[src_rows.clamp(min=0)], input_ids)
