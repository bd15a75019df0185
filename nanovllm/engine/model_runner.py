"""Runs the model for one scheduled batch: device setup, KV cache allocation, step inputs, sampling."""
import logging
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist

from nanovllm.attention.backend import get_attention_backend
from nanovllm.attention.metadata import AttentionMetadata, decode_order, shared_prefix, use_metadata
from nanovllm.config import Config
from nanovllm.engine.cuda_graph import DecodeGraphs, MixedGraphs
from nanovllm.engine.draft_verification import sample_with_drafts
from nanovllm.engine.logits_processors import needs_processing, process_logits
from nanovllm.engine.logprobs import StepLogprobs, prompt_logprobs, sampled_dicts, sampled_logprobs
from nanovllm.engine.pending import PendingStep
from nanovllm.engine.sampling_inputs import SamplingInputs
from nanovllm.engine.scheduler import ScheduledBatch
from nanovllm.engine.sequence import Sequence
from nanovllm.engine.step_inputs import stage_rows, take_in_flight_tokens
from nanovllm.engine.tp_worker import WorkerGroup
from nanovllm.layers.attention import Attention
from nanovllm.layers.sampler import Sampler, SamplingTensors
from nanovllm.models import get_model_class
from nanovllm.quant import kv as kv_quant
from nanovllm.quant.awq_method import read_awq_config
from nanovllm.utils.compile import set_compile_enabled
from nanovllm.utils.distributed import get_tp_rank
from nanovllm.utils.loader import load_dummy, load_model, process_weights_after_loading
from nanovllm.utils.pinned import PinnedDoubleBuffer

logger = logging.getLogger(__name__)


class ModelRunner:
    """Owns the model, its KV cache and the sampler on one device."""

    def __init__(self, config: Config):
        self.config = config
        self.workers = None
        if config.tensor_parallel_size > 1 and not dist.is_initialized():
            self.workers = WorkerGroup(config, type(self))   # rank 0: spawn ranks 1..N-1, join the group
        try:
            self._setup(config)
        except BaseException:
            self.shutdown()                        # a failed start leaves no worker behind
            raise

    def _setup(self, config: Config) -> None:
        self.rank = get_tp_rank()
        self.device = torch.device("cuda", self.rank) if config.device == "cuda" else config.torch_device
        self.block_size = config.kvcache_block_size
        hf = config.hf_config
        torch.manual_seed(config.seed)
        set_compile_enabled(self.device.type == "cuda" and not config.enforce_eager)
        self._baseline_bytes = torch.cuda.memory_allocated() if self.device.type == "cuda" else 0
        self.model = self._build_model()
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.backend = get_attention_backend(config.attention_backend, config.device, config.kv_cache_dtype)
        if config.kv_cache_dtype not in self.backend.kv_cache_dtypes:
            raise ValueError(f"attention_backend={self.backend.name!r} supports kv_cache_dtype "
                             f"{list(self.backend.kv_cache_dtypes)}, not {config.kv_cache_dtype!r}")
        for layer in self.attention_layers:
            layer.backend = self.backend
        self.sampler = Sampler()
        self.sampling_inputs = SamplingInputs(config.max_num_seqs, self.device, hf.vocab_size)
        self.vocab_size = hf.vocab_size
        self.graphs = self.mixed_graphs = None      # captured after the cache is sized
        self.num_kvcache_blocks = self._decide_num_blocks()
        self._allocate_kv_cache(self.num_kvcache_blocks)
        graphs = self.backend.supports_cuda_graphs and getattr(self.model, "supports_cuda_graphs", True)
        if self.device.type == "cuda" and not config.enforce_eager and not graphs:
            logger.info("%s runs every step eagerly (no CUDA graphs)", type(self.model).__name__)
        if self.device.type == "cuda" and not config.enforce_eager and graphs:
            layer = self.attention_layers[0]
            self.graphs = DecodeGraphs(self.model, self.backend, config, hf.hidden_size, layer.num_kv_heads)
            if self.backend.supports_mixed_graphs:
                self.mixed_graphs = MixedGraphs(self.model, self.backend, config, hf.hidden_size, layer.num_kv_heads,
                                                pool=self.graphs.pool)
            # sampled ids come back through two pinned buffers in turn, each with the event of its copy
            self._token_hosts = PinnedDoubleBuffer([(config.max_num_seqs, torch.int64)])
            self._events = [torch.cuda.Event(), torch.cuda.Event()]
        if self.device.type == "cuda" and not config.enforce_eager:
            self._warm_up_sampler()
        logger.info("KV cache (%s): %d blocks of %d tokens = %d tokens", config.kv_cache_dtype,
                    self.num_kvcache_blocks, self.block_size, self.num_kvcache_blocks * self.block_size)

    def _build_model(self) -> torch.nn.Module:
        config = self.config
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(config.dtype)
        try:
            quant_config = read_awq_config(config.model, config.hf_config)
            with torch.device(self.device):
                model = get_model_class(config.hf_config)(config.hf_config, quant_config)
        finally:
            torch.set_default_dtype(default_dtype)
        if config.load_format == "dummy":
            load_dummy(model, config.seed)
        else:
            load_model(model, config.model)
        process_weights_after_loading(model)
        return model.eval()

    @torch.inference_mode()
    def _warm_up_sampler(self) -> None:
        """Compile the sampling kernels now, for one row and for many, so that no step of a timed run pays
        for a compilation."""
        for rows in (2, 1):
            ones = torch.ones(rows, device=self.device)
            self.sampler(torch.zeros(rows, self.vocab_size, dtype=self.config.dtype, device=self.device),
                         SamplingTensors(temperatures=ones, top_ks=ones * self.vocab_size, top_ps=ones,
                                         min_ps=ones * 0, generators=[None] * rows, needs_filter=False,
                                         all_greedy=False))

    # ---- KV cache -------------------------------------------------------------------------------
    def block_bytes(self) -> int:
        """One block of every layer's K and V, scales included."""
        layer = self.attention_layers[0]
        per_token = kv_quant.bytes_per_token(self.config.kv_cache_dtype, self.config.dtype, layer.num_kv_heads,
                                             layer.head_dim)
        return per_token * self.block_size * len(self.attention_layers)

    def _decide_num_blocks(self) -> int:
        config = self.config
        if config.num_kvcache_blocks > 0:
            num_blocks = config.num_kvcache_blocks
        elif self.device.type == "cuda":
            num_blocks = self._blocks_from_gpu_memory()
        else:
            num_blocks = int(config.cpu_kvcache_space_gib * 2**30) // self.block_bytes()
        if config.tensor_parallel_size > 1:     # every rank must agree on the smallest
            count = torch.tensor([num_blocks], device=self.device)
            dist.all_reduce(count, op=dist.ReduceOp.MIN)
            num_blocks = int(count.item())
        needed = (config.max_model_len + self.block_size - 1) // self.block_size
        if num_blocks < needed:
            raise ValueError(f"the KV cache holds {num_blocks} blocks ({num_blocks * self.block_size} tokens), "
                             f"fewer than one sequence of max_model_len={config.max_model_len} needs; raise "
                             f"num_kvcache_blocks / gpu_memory_utilization / cpu_kvcache_space_gib or lower "
                             f"max_model_len")
        return num_blocks

    def _blocks_from_gpu_memory(self) -> int:
        """Run the largest prefill once with a small temporary cache, then give the cache whatever
        `gpu_memory_utilization` leaves after weights and peak activations."""
        config = self.config
        seq_len = min(config.max_model_len, config.max_num_batched_tokens)
        num_seqs = max(1, min(config.max_num_batched_tokens // seq_len, config.max_num_seqs))
        warmup_blocks = num_seqs * ((seq_len + self.block_size - 1) // self.block_size)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self._allocate_kv_cache(warmup_blocks)
        seqs = [Sequence([0] * seq_len) for _ in range(num_seqs)]
        blocks_per_seq = warmup_blocks // num_seqs
        for i, seq in enumerate(seqs):
            seq.block_table = list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq))
        self.run(ScheduledBatch(seqs, [seq_len] * num_seqs), mirror=False)
        torch.cuda.synchronize()
        # gpu_memory_utilization is this engine's share of the card: its weights and peak activations
        # (what this process allocated since the engine started), the CUDA context, then the KV cache.
        cache_bytes = warmup_blocks * self.block_bytes()
        free, total = torch.cuda.mem_get_info()
        stats = torch.cuda.memory_stats()
        engine_peak = stats["allocated_bytes.all.peak"] - cache_bytes - self._baseline_bytes
        non_torch = total - free - stats["reserved_bytes.all.current"]
        budget = total * config.gpu_memory_utilization - non_torch - engine_peak
        self._free_kv_cache()
        return max(0, int(budget) // self.block_bytes())

    def _allocate_kv_cache(self, num_blocks: int) -> None:
        layer = self.attention_layers[0]
        shape = self.backend.kv_cache_shape(num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
        self.kv_caches = kv_quant.allocate(len(self.attention_layers), shape, self.config.kv_cache_dtype,
                                           self.config.dtype, self.device)
        for layer, cache in zip(self.attention_layers, self.kv_caches):
            layer.kv_cache = cache

    def _free_kv_cache(self) -> None:
        for layer in self.attention_layers:
            layer.kv_cache = None
        del self.kv_caches
        torch.cuda.empty_cache()

    # ---- one step -------------------------------------------------------------------------------
    def _to_device(self, values, dtype=np.int64) -> torch.Tensor:
        """Host values on the step's device without waiting for the GPU: copied into pinned memory (torch's
        caching host allocator keeps the block until the copy has run), then copied asynchronously, so an
        eager step queues behind the one in flight (torch.tensor(..., device=cuda) would wait for it)."""
        host = torch.from_numpy(np.asarray(values, dtype=dtype))
        if self.device.type != "cuda":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def prepare(self, batch: ScheduledBatch, prev: PendingStep | None = None):
        """Flat input ids and positions, the attention metadata, and which rows to sample. An input token
        still in flight (a placeholder) is gathered on the device from `prev`'s sampled ids."""
        num_seqs = len(batch.seqs)
        tables = np.full((num_seqs, max(len(seq.block_table) for seq in batch.seqs)), -1, dtype=np.int32)
        ids, pos, slots, src = np.empty((4, batch.num_tokens), dtype=np.int64)
        ctx, cu = np.empty(num_seqs, dtype=np.int32), np.empty(num_seqs + 1, dtype=np.int32)
        stage_rows(batch, tables, ids, pos, slots, src, ctx, cu, prev, self.block_size)
        context_lens, cu_q = ctx.tolist(), cu.tolist()
        num_splits, order, shared = 1, None, None
        decodes = context_lens[:batch.num_decodes]   # the decode rows (all rows of a decode step)
        if decodes:
            num_splits = self.backend.plan_decode(len(decodes), self.attention_layers[0].num_kv_heads, max(decodes))
            order = self._to_device(decode_order(decodes), np.int32)
        if not batch.is_prefill and self.config.enable_cascade_attention and self.backend.supports_cascade:
            plan = shared_prefix([s.block_table for s in batch.seqs], context_lens, self.block_size)
            shared = self._to_device(plan, np.int32) if plan[0] else None   # None: nothing shared
        meta = AttentionMetadata(
            is_prefill=batch.is_prefill, slot_mapping=self._to_device(slots),
            context_lens=self._to_device(ctx, np.int32), block_tables=self._to_device(tables, np.int32),
            cu_seqlens_q=self._to_device(cu, np.int32),
            max_seqlen_q=max(batch.num_new_tokens), max_seqlen_k=max(context_lens),
            context_lens_cpu=context_lens, cu_seqlens_q_cpu=cu_q, num_decodes=batch.num_decodes,
            num_decode_splits=num_splits, decode_order=order, shared=shared)
        input_ids = self._to_device(ids)
        if (src >= 0).any():
            take_in_flight_tokens(input_ids, self._to_device(src), prev)
        return input_ids, self._to_device(pos), meta, batch.sample_rows

    def _forward(self, batch: ScheduledBatch, prev: PendingStep | None = None):
        """Hidden states, the batch rows to sample, and the metadata (None on a CUDA graph, whose hidden
        states are already those of the step's logit positions: batch.logit_positions)."""
        graphs = self._graphs_for(batch)
        if graphs is not None:
            return graphs.run(batch if graphs is self.mixed_graphs else batch.seqs, prev), batch.sample_rows, None
        input_ids, positions, meta, sample_rows = self.prepare(batch, prev)
        with use_metadata(meta):
            return self.model(input_ids, positions), sample_rows, meta

    def _logit_positions(self, batch: ScheduledBatch, meta: AttentionMetadata) -> torch.Tensor:
        return self._to_device(batch.logit_positions(meta.cu_seqlens_q_cpu))

    @torch.inference_mode()
    def forward_logits(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[int]]:
        """Logits [len(sample_rows), vocab] at the last token of every sequence whose step reaches its
        end, and those sequences' rows in the batch."""
        hidden_states, sample_rows, meta = self._forward(batch)
        if meta is not None:
            hidden_states = hidden_states[self._logit_positions(batch, meta)]
        return self.model.compute_logits(hidden_states), sample_rows

    def run(self, batch: ScheduledBatch, mirror: bool = True) -> tuple[list[int | None], StepLogprobs]:
        """The sampled token for every scheduled sequence whose step reached its last token (else None),
        and the logprobs the requests asked for. Under tensor parallelism the workers run it too."""
        if mirror and self.workers is not None:
            self.workers.call("run", batch, False)
        with self._worker_errors():
            return self._run(batch)

    @contextmanager
    def _worker_errors(self):
        """A collective that fails because a worker died reports that worker's error."""
        try:
            yield
        except Exception:
            if self.workers is not None:
                self.workers.raise_worker_error(wait_s=10)
            raise

    def shutdown(self) -> None:
        if self.workers is not None:
            self.workers.shutdown()
            self.workers = None

    @torch.inference_mode()
    def _run(self, batch: ScheduledBatch) -> tuple[list[int | None], StepLogprobs]:
        hidden_states, sample_rows, meta = self._forward(batch)
        step_logprobs = StepLogprobs()
        if meta is not None:
            if batch.is_prefill:
                step_logprobs.prompt = prompt_logprobs(self.model.compute_logits, hidden_states, batch,
                                                       meta.cu_seqlens_q_cpu)
            hidden_states = hidden_states[self._logit_positions(batch, meta)]
        token_ids: list[int | list[int] | None] = [None] * len(batch.seqs)
        if sample_rows and batch.num_drafted:
            step_logprobs.sampled = sample_with_drafts(batch, self.model.compute_logits(hidden_states),
                                                       self.sampling_inputs.tensors, token_ids)
        elif sample_rows:
            seqs = [batch.seqs[i] for i in sample_rows]
            logits = self.model.compute_logits(hidden_states)
            # processors change what is sampled; logprobs stay the model's own (vLLM's raw_logprobs)
            to_sample = process_logits(logits, seqs) if needs_processing(seqs) else logits
            sampled = self.sampler(to_sample, self.sampling_inputs.tensors(seqs))
            wanted = sampled_logprobs(logits, sampled, batch.seqs, sample_rows)
            for row, token_id in zip(sample_rows, sampled.tolist()):
                token_ids[row] = token_id
            step_logprobs.sampled = sampled_dicts(wanted, batch.seqs, token_ids)
        return token_ids, step_logprobs

    @staticmethod
    def _wants_prompt_logprobs(batch: ScheduledBatch) -> bool:
        return any(seq.sampling_params.prompt_logprobs is not None for seq in batch.seqs[batch.num_decodes:])

    def _graphs_for(self, batch: ScheduledBatch):
        """The CUDA graphs that run this step, or None (eager): decode graphs for decode steps, mixed graphs
        for steps with prefill chunks up to their token limit, unless a request wants prompt logprobs
        (which need every position's hidden state)."""
        if not batch.is_prefill:
            return self.graphs if self.graphs is not None and self.graphs.can_run(len(batch.seqs)) else None
        if self.mixed_graphs is None or not self.mixed_graphs.can_run(batch) or self._wants_prompt_logprobs(batch):
            return None
        return self.mixed_graphs

    def can_launch_async(self, batch: ScheduledBatch) -> bool:
        """With CUDA graphs on, a step can be launched without waiting for the previous step's tokens,
        whether it replays a graph or runs eagerly (a step over the graphs' token limit), unless a request's
        logits processors need those tokens (penalties, bad words, min_tokens), the step verifies drafts,
        or it computes prompt logprobs (read back at once)."""
        return (self.graphs is not None and not needs_processing(batch.seqs) and not batch.num_drafted
                and not (batch.is_prefill and self._wants_prompt_logprobs(batch)))

    def launch(self, batch: ScheduledBatch, prev: PendingStep | None) -> PendingStep:
        """Enqueue a step on CUDA graphs (inputs, graph, logits, sampling, copy of the ids to the host); no wait.
        Sequences whose last token is a placeholder take it from `prev` on the GPU."""
        if self.workers is not None and self.rank == 0:
            self.workers.call("launch", batch)
        with self._worker_errors():
            return self._launch(batch, prev)

    @torch.inference_mode()
    def _launch(self, batch: ScheduledBatch, prev: PendingStep | None) -> PendingStep:
        hidden_states, sample_rows, meta = self._forward(batch, prev)
        if meta is not None:    # an eager step: every token's hidden state
            hidden_states = hidden_states[self._logit_positions(batch, meta)]
        seqs = [batch.seqs[row] for row in sample_rows]
        wanted = None
        if seqs:
            logits = self.model.compute_logits(hidden_states)
            token_ids = self.sampler(logits, self.sampling_inputs.tensors(seqs))
            if self.config.tensor_parallel_size > 1:
                dist.broadcast(token_ids, src=0)       # every rank feeds rank 0's samples to the next step
            wanted = sampled_logprobs(logits, token_ids, batch.seqs, sample_rows)
        else:   # only chunks that end mid-prompt: nothing to sample
            token_ids = torch.zeros(0, dtype=torch.int64, device=self.device)
        done = self._events[self._token_hosts.turn]
        host = self._token_hosts.next_host()[0][:len(seqs)]
        host.copy_(token_ids, non_blocking=True)
        done.record()
        rows = {seq.seq_id: i for i, seq in enumerate(seqs)}
        return PendingStep(batch, token_ids, rows, host, done, wanted)
