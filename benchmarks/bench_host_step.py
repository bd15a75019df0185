"""The host's share of a step, measured on any machine: bench.py's workloads with the GPU replaced by nothing.

    python benchmarks/bench_host_step.py [--workload short] [--max-num-seqs 1024] [--profile]

With CUDA graphs and overlapped steps, the GPU idles whenever the host takes longer to prepare step N+1
(schedule, stage the graph's inputs, sampling settings, read step N's tokens, stop checks) than the GPU
takes to run step N. This runs the engine's own host code for a whole workload: LLMEngine.step, the
Scheduler and BlockManager, and the CUDA graph classes' input staging (cuda_graph.DecodeGraphs and
MixedGraphs, their buffers on the CPU and nothing captured or replayed); sampling returns random ids. The
time per step kind, and with --profile the functions that take it, say where the host spends a step, to
set against the GPU's time per step (bench.py --profile). A step over the mixed graphs' token limit is
launched like the engine launches it, its inputs built by ModelRunner.prepare (the model not run).
Writes results/host/host-<workload>.json.
"""
import argparse
import cProfile
import pstats
import random
import sys
import time
import types

import torch

import nanovllm.engine.cuda_graph as cuda_graph
import nanovllm.utils.pinned as pinned
from bench import make_workload  # the repository root's bench.py
from nanovllm.attention.torch_ref import TorchBackend
from nanovllm.config import Config
from nanovllm.configs import shipped_config_dir
from nanovllm.engine.llm_engine import LLMEngine, step_stats
from nanovllm.engine.logprobs import sampled_logprobs
from nanovllm.engine.model_runner import ModelRunner
from nanovllm.engine.pending import PendingStep
from nanovllm.engine.sampling_inputs import SamplingInputs
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence
from nanovllm.sampling_params import SamplingParams
from nanovllm.utils.results import results_path, save_record


class _OnCpu(types.ModuleType):
    """torch, with device="cuda" allocations made on the CPU (the graph classes allocate on "cuda")."""

    def __getattr__(self, name):
        value = getattr(torch, name)
        if name not in ("zeros", "arange", "empty", "full"):
            return value

        def on_cpu(*args, **kwargs):
            if kwargs.get("device") == "cuda":
                kwargs["device"] = "cpu"
            kwargs.pop("pin_memory", None)
            return value(*args, **kwargs)
        return on_cpu


class _NoGraph:
    def replay(self):
        pass


class _Done:
    def synchronize(self):
        pass


def _capture_nothing(self):
    keys = [(s, c) for s in self.sizes for c in (False, True)] if isinstance(self, cuda_graph.DecodeGraphs) \
        else self.sizes
    self.graphs, self.pool = {key: _NoGraph() for key in keys}, None


class HostOnlyRunner:
    """The model runner's host side: graph input staging, an eager step's inputs (ModelRunner.prepare) and
    sampling settings; random sampled ids."""

    def __init__(self, config: Config):
        backend = TorchBackend()
        backend.supports_cascade = config.enable_cascade_attention
        self.decode = cuda_graph.DecodeGraphs(None, backend, config, 8, 8)
        self.mixed = cuda_graph.MixedGraphs(None, backend, config, 8, 8)
        self.sampling_inputs = SamplingInputs(config.max_num_seqs, torch.device("cpu"), 1000)
        # what ModelRunner.prepare reads of its runner
        self.config, self.backend, self.block_size = config, backend, config.kvcache_block_size
        self.device = torch.device("cpu")
        self.attention_layers = [types.SimpleNamespace(num_kv_heads=8)]

    def can_launch_async(self, batch) -> bool:
        return True     # as the engine with CUDA graphs, without logits processors, drafts or prompt logprobs

    _to_device = ModelRunner._to_device
    prepare = ModelRunner.prepare

    def launch(self, batch, prev) -> PendingStep:
        if not self.mixed.can_run(batch) and batch.is_prefill:
            self.prepare(batch, prev)        # an eager step
        elif batch.is_prefill:
            self.mixed.run(batch, prev)
        else:
            self.decode.run(batch.seqs, prev)
        seqs = [batch.seqs[row] for row in batch.sample_rows]
        self.sampling_inputs.tensors(seqs)
        token_ids = torch.randint(0, 1000, (len(seqs),))
        sampled_logprobs(None, token_ids, batch.seqs, batch.sample_rows)
        return PendingStep(batch, token_ids, {seq.seq_id: i for i, seq in enumerate(seqs)}, token_ids, _Done())

    def shutdown(self):
        pass


def host_only_engine(max_num_seqs: int, num_blocks: int) -> LLMEngine:
    cuda_graph.torch = pinned.torch = _OnCpu("torch")
    cuda_graph.DecodeGraphs._capture_all = cuda_graph.MixedGraphs._capture_all = _capture_nothing
    config = Config(shipped_config_dir("Qwen3-0.6B"), device="cpu", max_num_seqs=max_num_seqs,
                    num_kvcache_blocks=num_blocks, max_model_len=17000)
    engine = LLMEngine.__new__(LLMEngine)    # everything but the model
    engine.config, engine.tokenizer, engine.eos_token_ids = config, None, frozenset()
    Sequence.block_size = config.kvcache_block_size
    engine.model_runner = HostOnlyRunner(config)
    engine.scheduler = Scheduler(config, num_blocks)
    engine.pending, engine.stats = None, step_stats()
    return engine


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="short", choices=["random", "short", "long", "prefix"])
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    parser.add_argument("--num-blocks", type=int, default=2600, help="KV cache blocks (H100, Qwen3-0.6B: ~2,500)")
    parser.add_argument("--profile", action="store_true", help="also list the 20 functions that take most time")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    random.seed(0)
    w = make_workload(args.workload, argparse.Namespace(num_seqs=256, max_input_len=1024, max_output_len=1024))
    engine = host_only_engine(args.max_num_seqs, args.num_blocks)
    for prompt, n in zip(w.prompts, w.max_tokens):
        engine.add_request(prompt, SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n))
    per_kind: dict[str, list[float]] = {}
    profiler = cProfile.Profile() if args.profile else None
    start = time.perf_counter()
    while not engine.scheduler.is_finished():
        t = time.perf_counter()
        if profiler:
            profiler.enable()
        _, _, kind = engine.step()
        if profiler:
            profiler.disable()
        per_kind.setdefault(kind, []).append(time.perf_counter() - t)
    seconds = time.perf_counter() - start
    record = {"workload": args.workload, "max_num_seqs": args.max_num_seqs, "host_s": round(seconds, 3),
              "steps": {k: len(v) for k, v in per_kind.items()},
              "host_ms_per_step": {k: round(1e3 * sum(v) / len(v), 3) for k, v in per_kind.items()},
              # of which enqueuing the step (engine.stats' launch_s, as bench.py reports it on the GPU)
              "launch_ms_per_step": {k: round(1e3 * engine.stats[f"{k}_launch_s"] / len(v), 3)
                                     for k, v in per_kind.items()},
              "profiled": args.profile, "command": "python " + " ".join(sys.argv)}
    save_record(record, args.out or results_path("host", f"host-{args.workload}.json"))
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
