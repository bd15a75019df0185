"""Decode attention over bench.py's decode steps: how the split-KV factor should follow the batch size.

    python tests/kv_quant/bench_decode_steps.py [--kv-cache-dtype auto int8 fp8] [--every 32] [--splits 1 2 4 8]

bench.py's batch starts at 256 sequences and shrinks as they finish (max_tokens 100..1,024) while their
contexts grow (prompts 100..1,024). Every --every-th decode step is rebuilt here as the CUDA graph runs it
(padded to the graph's batch size, padding rows of context 0, longest first) and one layer's decode attention
is timed at each split-KV factor, combine kernel included. The step's time stands for --every steps; summed
over the run and times the model's 28 layers it is the run's decode-attention seconds for each policy:
the engine's (num_decode_splits), one factor for all, and the best factor per graph batch size.
Qwen3-0.6B attention shape; writes benchmark_results/kv_int8_cache/decode-steps.json.
"""
import argparse
import json
import os
import sys
from collections import defaultdict
from datetime import datetime, timezone

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from bench import workload  # noqa: E402
from nanovllm.attention.metadata import decode_order  # noqa: E402
from nanovllm.attention.triton_decode import decode_attention, num_decode_splits  # noqa: E402
from nanovllm.engine.cuda_graph import graph_batch_sizes  # noqa: E402
from nanovllm.quant.kv import LayerKVCache, quantize_ref, quantized_cache  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, LAYERS = 16, 8, 128, 256, 28
MAX_MODEL_LEN = 4096      # bench.py's: the engine plans each graph's splits with it


def bench_steps(every: int) -> list[tuple[int, list[int]]]:
    """(step, context lengths of the running sequences) for every `every`-th decode step of bench.py."""
    prompts, max_tokens = workload(256, 1024, 1024)
    steps = []
    for step in range(1, max(max_tokens), every):
        # after prefill each sequence holds its prompt and one sampled token; decode step s adds token s + 1
        running = [len(p) + step for p, n in zip(prompts, max_tokens) if n > step]
        steps.append((step, running))
    return steps


def make_cache(kind: str, num_blocks: int) -> LayerKVCache:
    shape = (num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k, v = (torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    if kind == "auto":
        return LayerKVCache(k, v)
    (kq, ks), (vq, vs) = quantize_ref(k, kind), quantize_ref(v, kind)
    return quantized_cache(kq, vq, ks, vs)


def time_steps(cache: LayerKVCache, steps, q, tables, split_factors: list[int], num_sms: int) -> list[dict]:
    """One layer's decode attention at each sampled step (padded as its CUDA graph runs it), per split factor."""
    sizes = graph_batch_sizes(256)
    n = len(steps[0][1])
    first = torch.tensor(steps[0][1], dtype=torch.int32, device="cuda")
    for splits in split_factors:     # compile every factor first: a timing right after a compilation reads slow
        decode_attention(q[:n], cache, tables[:n], first, 1.0, splits, order=torch.arange(n, device="cuda").int())
    per_step = []
    for step, running in steps:
        graph_bs = next(s for s in sizes if s >= len(running))
        lens = running + [0] * (graph_bs - len(running))
        order = torch.from_numpy(decode_order(lens)).cuda()
        ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
        us = {}
        for splits in split_factors:
            us[splits] = round(1e3 * do_bench(
                lambda: decode_attention(q[:graph_bs], cache, tables[:graph_bs], ctx, HEAD_DIM ** -0.5, splits,
                                         order=order), warmup=5, rep=25, return_mode="median"), 2)
        per_step.append({"step": step, "batch": len(running), "graph_batch": graph_bs,
                         "mean_context": round(sum(running) / len(running)),
                         "engine_splits": num_decode_splits(graph_bs, KV_HEADS, MAX_MODEL_LEN, num_sms), "us": us})
    return per_step


def totals(per_step: list[dict], every: int, split_factors: list[int]) -> dict:
    """Seconds of decode attention per bench.py run (each sampled step stands for `every` steps, 28 layers)."""
    scale = every * LAYERS / 1e6
    by_graph = defaultdict(lambda: defaultdict(float))
    for r in per_step:
        for s, t in r["us"].items():
            by_graph[r["graph_batch"]][s] += t
    return {
        "engine_policy_s": round(scale * sum(r["us"][r["engine_splits"]] for r in per_step
                                             if r["engine_splits"] in r["us"]), 4),
        "fixed_splits_s": {s: round(scale * sum(r["us"][s] for r in per_step), 4) for s in split_factors},
        "best_per_graph_batch_s": round(scale * sum(min(t.values()) for t in by_graph.values()), 4),
        "best_splits_per_graph_batch": {bs: min(t, key=t.get) for bs, t in sorted(by_graph.items())},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kv-cache-dtype", nargs="+", default=["auto", "int8", "fp8"])
    parser.add_argument("--every", type=int, default=32)
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--out", default="benchmark_results/kv_int8_cache/decode-steps.json")
    args = parser.parse_args()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    steps = bench_steps(args.every)
    max_blocks = MAX_MODEL_LEN // BLOCK_SIZE
    tables = torch.randperm(256 * max_blocks, device="cuda").view(256, max_blocks).int()
    q = torch.randn(256, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    records = []
    for kind in args.kv_cache_dtype:
        per_step = time_steps(make_cache(kind, 256 * max_blocks), steps, q, tables, args.splits, num_sms)
        for r in per_step:
            print(json.dumps({"kv": kind, **r}), flush=True)
        records.append({"kv_cache_dtype": kind, **totals(per_step, args.every, args.splits), "steps": per_step})
        print(json.dumps({k: v for k, v in records[-1].items() if k != "steps"}), flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "command": "python " + " ".join(sys.argv),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "every": args.every,
            "layers": LAYERS}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({**meta, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
