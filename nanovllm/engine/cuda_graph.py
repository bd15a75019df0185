"""CUDA graphs for the decode step: one graph per padded batch size, replayed over persistent buffers.

A decode step is ~10 kernels per layer, ~300 in all; launching them one by one from Python costs more than
they run. A graph records the launches once and replays them with one call. Everything a graph reads must sit
at a fixed address, so the step's inputs are written into pinned host buffers and copied into fixed
device buffers (two copies per step, no new tensors). The host buffers come in pairs used in turn: with
overlapped steps, the copy of step N-1 may not have run yet when step N's inputs are written. An input
token still on the GPU (a placeholder on the host) is gathered from the previous step's sampled ids.
Batch sizes 1, 2, 4, 8, then every 16 up to max_num_seqs (always included) are captured; a batch runs on
the next larger graph, its padding rows having slot -1 (nothing written) and context length 0 (nothing
read). Block-table rows are rewritten in full each step, so no stale entry survives from an earlier batch.
The host also writes the decode launch order (rows by descending context, metadata.decode_order), and with
cascade attention the plan of a prefix shared by several rows (metadata.shared_prefix): each batch size then
has a second graph that reads it, replayed only on steps that share something.
"""
import contextlib
import gc

import torch

from nanovllm.attention.metadata import AttentionMetadata, decode_order, shared_prefix, use_metadata
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.step_inputs import stage_one_token_rows, stage_rows, take_in_flight_tokens, write_block_tables
from nanovllm.utils.pinned import PinnedDoubleBuffer


@contextlib.contextmanager
def no_garbage_collection():
    """Collect garbage once, then none while graphs are captured: a collection during a capture that frees
    an earlier engine's CUDA graph destroys it on the capturing stream, which CUDA forbids, and the capture
    fails ("operation failed due to a previous error during capture"). torch no longer collects before a
    capture by itself (torch.compiler.config.force_cudagraph_gc)."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def capture_forward(model: torch.nn.Module, meta: AttentionMetadata, input_ids: torch.Tensor,
                    positions: torch.Tensor, outputs: torch.Tensor, pool) -> torch.cuda.CUDAGraph:
    """One forward to warm up (compilation, autotuning), then the same forward captured into a graph whose
    memory comes from `pool` (None: a new pool); it writes outputs[:len(input_ids)]."""
    n = len(input_ids)
    graph = torch.cuda.CUDAGraph()
    with use_metadata(meta):
        outputs[:n] = model(input_ids, positions)
        with torch.cuda.graph(graph, pool):
            outputs[:n] = model(input_ids, positions)
    torch.cuda.synchronize()
    return graph


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    sizes = {s for s in (1, 2, 4, 8) if s <= max_num_seqs} | set(range(16, max_num_seqs + 1, 16))
    return sorted(sizes | {max_num_seqs})


class DecodeGraphs:
    """Captured decode graphs and the buffers they read and write."""

    def __init__(self, model: torch.nn.Module, backend, config, hidden_size: int, num_kv_heads: int):
        self.model, self.block_size = model, config.kvcache_block_size
        n = config.max_num_seqs
        max_blocks = (config.max_model_len + self.block_size - 1) // self.block_size
        self.sizes = graph_batch_sizes(n)
        # staging: [input_ids | positions | slot_mapping | source row] int64,
        # [context_lens | decode order | cascade plan (2 + n) | block_tables] int32
        self.staging = PinnedDoubleBuffer([(4 * n, torch.int64), (n * (3 + max_blocks) + 2, torch.int32)], "cuda")
        self.max_blocks = max_blocks
        self.dev64, self.dev32 = self.staging.devices
        self.input_ids, self.positions, self.slots, self.src_rows = self.dev64.view(4, n)
        self.context_lens, self.order = self.dev32[:n], self.dev32[n:2 * n]
        self.shared = self.dev32[2 * n:3 * n + 2]
        self.block_tables = self.dev32[3 * n + 2:].view(n, max_blocks)
        # cascade attention (config.enable_cascade_attention): a second graph per batch size reads
        # metadata.shared_prefix's plan; a step that shares nothing replays the plain one, at no extra cost
        self.cascade = config.enable_cascade_attention and backend.supports_cascade
        self.order.copy_(torch.arange(n, dtype=torch.int32))    # capture runs read every row
        self.shared.zero_()
        self.cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32, device="cuda")
        self.outputs = torch.zeros(n, hidden_size, dtype=config.dtype, device="cuda")
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}   # (batch size, cascade) -> graph
        self.splits = {bs: backend.plan_decode(bs, num_kv_heads, config.max_model_len) for bs in self.sizes}
        self._capture_all()

    def _meta(self, bs: int, cascade: bool) -> AttentionMetadata:
        return AttentionMetadata(is_prefill=False, slot_mapping=self.slots[:bs], context_lens=self.context_lens[:bs],
                                 block_tables=self.block_tables[:bs], cu_seqlens_q=self.cu_seqlens_q[:bs + 1],
                                 max_seqlen_q=1, max_seqlen_k=0, context_lens_cpu=[], cu_seqlens_q_cpu=[],
                                 num_decode_splits=self.splits[bs], decode_order=self.order[:bs],
                                 shared=self.shared[:2 + bs] if cascade else None)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        self.slots.fill_(-1)                       # capture-time runs must not write the cache
        pool = None
        with no_garbage_collection():
            for bs in reversed(self.sizes):        # largest first: the others reuse its memory pool
                for cascade in (False, True) if self.cascade else (False,):
                    graph = capture_forward(self.model, self._meta(bs, cascade), self.input_ids[:bs],
                                            self.positions[:bs], self.outputs, pool)
                    pool = graph.pool()
                    self.graphs[bs, cascade] = graph
        self.pool = pool                           # shared with the mixed-step graphs

    def can_run(self, num_seqs: int) -> bool:
        return num_seqs <= self.sizes[-1]

    def run(self, seqs: list[Sequence], prev=None) -> torch.Tensor:
        """Hidden states [len(seqs), hidden] of each sequence's last token (its decode step). `prev` is the
        in-flight step holding the sampled ids of sequences whose last token is a placeholder."""
        bs = len(seqs)
        graph_bs = next(s for s in self.sizes if s >= bs)
        n, block_size = len(self.input_ids), self.block_size
        host64, host32 = self.staging.next_host()
        ids, pos, slots, src = host64.numpy().reshape(4, n)
        ctx, order = host32.numpy()[:n], host32.numpy()[n:2 * n]
        tables = host32.numpy()[3 * n + 2:].reshape(n, self.max_blocks)
        tables[:graph_bs] = -1
        write_block_tables(tables, [seq.block_table for seq in seqs])
        ctx[:bs] = stage_one_token_rows(seqs, tables, ids, pos, slots, src, prev, block_size)
        gather = bool((src[:bs] >= 0).any())
        ids[bs:graph_bs] = pos[bs:graph_bs] = 0
        slots[bs:graph_bs] = -1
        ctx[bs:graph_bs] = 0
        order[:graph_bs] = decode_order(ctx[:graph_bs])
        cascade = False
        if self.cascade:
            plan = host32.numpy()[2 * n:3 * n + 2]
            plan[:2 + bs] = shared_prefix([seq.block_table for seq in seqs], ctx[:bs].tolist(), block_size)
            plan[2 + bs:2 + graph_bs] = 0
            cascade = bool(plan[0])
        self.staging.upload([host64, host32], [None, 3 * n + 2 + graph_bs * self.max_blocks])
        if gather:
            take_in_flight_tokens(self.input_ids[:bs], self.src_rows[:bs], prev)
        self.graphs[graph_bs, cascade].replay()
        return self.outputs[:bs]


MIXED_MAX_TOKENS = 4096   # larger steps run eagerly: their GPU work outweighs the launches by far


def mixed_token_sizes(max_tokens: int) -> list[int]:
    """Token counts captured for steps that carry prefill chunks: every 64 up to 1,024, every 128 up to
    2,048, every 256 up to max_tokens (always included): a step pads at most 1/8 of its tokens past 512."""
    sizes = set(range(64, 1025, 64)) | set(range(1152, 2049, 128)) | set(range(2304, max_tokens + 1, 256))
    return sorted({s for s in sizes if s <= max_tokens} | {max_tokens})


class MixedGraphs:
    """CUDA graphs for steps that carry prefill chunks (with or without decodes), one per padded token
    count. What a prefill launch usually takes from the host (the longest chunk, the number of sequences)
    is replaced by device buffers: the prefill kernel reads a tile map of (sequence, query tile) pairs
    (triton_prefill.flat_tiles) and K/V are stored by slot. The decode rows (first in the batch, one token
    each) go to the decode kernel, launched over the graph's first min(tokens, max_num_seqs) rows with a
    context of 0 for rows that are not decodes (nothing read and nothing written: the prefill kernel writes
    those rows). Sequences up to max_num_seqs; padding tokens have slot -1 and belong to no tile, padding
    sequences have no query and context 0."""

    def __init__(self, model: torch.nn.Module, backend, config, hidden_size: int, num_kv_heads: int, pool=None):
        from nanovllm.attention.triton_prefill import FLAT_BLOCK_M, flat_tiles
        self.model, self.block_size, self.flat_tiles = model, config.kvcache_block_size, flat_tiles
        self.max_tokens = min(MIXED_MAX_TOKENS, config.max_num_batched_tokens)
        self.sizes = mixed_token_sizes(self.max_tokens)
        t, s = self.max_tokens, config.max_num_seqs
        self.max_seqs, self.max_blocks = s, (config.max_model_len + self.block_size - 1) // self.block_size
        self.capacity = {n: n // FLAT_BLOCK_M + min(n, s) for n in self.sizes}   # tiles per graph
        self.decode_rows = {n: min(n, s) for n in self.sizes}                     # decode launch per graph
        self.splits = {n: backend.plan_decode(rows, num_kv_heads, config.max_model_len)
                       for n, rows in self.decode_rows.items()}
        tiles = self.capacity[self.sizes[-1]]
        # staging: [input_ids | positions | slot_mapping | source row | logit positions] x t: int64;
        # [context_lens s | decode contexts s | cu_seqlens_q s + 1 | tile map 2 * tiles | block_tables
        # s * max_blocks]: int32
        self.len64, self.len32 = 5 * t, 3 * s + 1 + 2 * tiles + s * self.max_blocks
        self.staging = PinnedDoubleBuffer([(self.len64, torch.int64), (self.len32, torch.int32)], "cuda")
        self.dev64, self.dev32 = self.staging.devices
        self.input_ids, self.positions, self.slots, self.src_rows = self.dev64[:4 * t].view(4, t)
        self.last_tokens = self.dev64[4 * t:]
        self.context_lens, self.decode_ctx = self.dev32[:s], self.dev32[s:2 * s]
        self.cu_seqlens_q = self.dev32[2 * s:3 * s + 1]
        self.tiles = self.dev32[3 * s + 1:3 * s + 1 + 2 * tiles].view(tiles, 2)
        self.block_tables = self.dev32[3 * s + 1 + 2 * tiles:].view(s, self.max_blocks)
        self.outputs = torch.zeros(t, hidden_size, dtype=config.dtype, device="cuda")
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = pool
        self._capture_all()

    def _meta(self, n: int) -> AttentionMetadata:
        return AttentionMetadata(is_prefill=True, slot_mapping=self.slots[:n], context_lens=self.context_lens,
                                 block_tables=self.block_tables, cu_seqlens_q=self.cu_seqlens_q,
                                 max_seqlen_q=n, max_seqlen_k=0, context_lens_cpu=[], cu_seqlens_q_cpu=[],
                                 tiles=self.tiles[:self.capacity[n]], num_decode_splits=self.splits[n],
                                 decode_context_lens=self.decode_ctx[:self.decode_rows[n]])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        self.slots.fill_(-1)                  # capture-time runs write no cache and read none
        self.tiles[:, 0] = -1
        self.context_lens.zero_()
        self.decode_ctx.zero_()
        self.cu_seqlens_q.zero_()
        with no_garbage_collection():
            for n in reversed(self.sizes):
                graph = capture_forward(self.model, self._meta(n), self.input_ids[:n], self.positions[:n],
                                        self.outputs, self.pool)
                self.pool = graph.pool()
                self.graphs[n] = graph

    def can_run(self, batch) -> bool:
        return batch.num_tokens <= self.max_tokens and len(batch.seqs) <= self.max_seqs

    def run(self, batch, prev=None) -> torch.Tensor:
        """Hidden states at the step's logit positions (batch.logit_positions): the last token of every
        sequence whose step reaches its end, and a drafted decode's every position. A placeholder input
        token is gathered from `prev`'s sampled ids."""
        num_tokens, num_seqs = batch.num_tokens, len(batch.seqs)
        n = next(s for s in self.sizes if s >= num_tokens)
        t, s, bs = self.max_tokens, self.max_seqs, self.block_size
        host64, host32 = self.staging.next_host()
        h64, h32 = host64.numpy(), host32.numpy()
        ids, pos, slots, src = h64[:4 * t].reshape(4, t)
        last = h64[4 * t:]
        ctx, decode_ctx, cu = h32[:s], h32[s:2 * s], h32[2 * s:3 * s + 1]
        tiles = h32[3 * s + 1:3 * s + 1 + 2 * self.capacity[self.sizes[-1]]]
        tables = h32[3 * s + 1 + len(tiles):].reshape(s, self.max_blocks)
        tables[:num_seqs] = -1
        stage_rows(batch, tables, ids, pos, slots, src, ctx, cu, prev, bs)
        decodes = batch.num_decodes                  # rows 0..decodes-1: one token each, row i is token i
        gather = bool((src[:num_tokens] >= 0).any())
        ids[num_tokens:n] = pos[num_tokens:n] = 0
        slots[num_tokens:n] = -1
        ctx[num_seqs:] = 0
        cu[num_seqs + 1:] = num_tokens
        decode_ctx[:decodes] = ctx[:decodes]
        decode_ctx[decodes:self.decode_rows[n]] = 0
        cap = self.capacity[n]
        tiles[:2 * cap] = self.flat_tiles([0] * decodes + list(batch.num_new_tokens[decodes:]), cap).reshape(-1)
        read = batch.logit_positions(cu)
        last[:len(read)] = read
        self.staging.upload([host64, host32])
        if gather:
            take_in_flight_tokens(self.input_ids[:num_tokens], self.src_rows[:num_tokens], prev)
        self.graphs[n].replay()
        return self.outputs[self.last_tokens[:len(read)]]
