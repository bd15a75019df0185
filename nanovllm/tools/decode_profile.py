"""How long the GPU sits idle between decode steps: `python -m nanovllm.tools.decode_profile [options]`.

Fills a batch of running sequences, then records `--steps` decode steps with the PyTorch profiler. GPU
busy time is the union of kernel and copy intervals; idle fraction = 1 - busy / wall window, stall fraction the
part of it in gaps of 20 us or more (the GPU without work, not between two launches of a step). Prints one
JSON line (and writes it with --out).
"""
import argparse
import json
import os
import random
import sys
import time
from datetime import datetime, timezone

import torch
from torch.profiler import ProfilerActivity, profile

from nanovllm import LLM, SamplingParams
from nanovllm.configs import shipped_config_dir, with_awq_config
from nanovllm.utils.results import save_record


def busy_intervals(prof) -> list[tuple[float, float]]:
    spans = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
            spans.append((e.time_range.start, e.time_range.end))
    return sorted(spans)


def top_kernels(profs: list, steps: int, n: int = 12) -> dict[str, float]:
    """Device milliseconds per step of the n most expensive kernels over these profiles."""
    totals: dict[str, float] = {}
    for prof in profs:
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                totals[e.name[:80]] = totals.get(e.name[:80], 0.0) + (e.time_range.end - e.time_range.start)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:n]
    return {name: round(us / 1e3 / steps, 4) for name, us in ranked}


def union_length(spans: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for start, end in spans:
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return total + (cur_end - cur_start if cur_end is not None else 0.0)


STALL_US = 20.0   # a gap at least this long is the GPU waiting for work; shorter ones are launch gaps


def stall_length(spans: list[tuple[float, float]], threshold_us: float = STALL_US) -> float:
    """The idle time of sorted (start, end) spans that lies in gaps of at least threshold_us. Inside a step
    (a CUDA graph, back-to-back launches) the GPU waits a microsecond or two between kernels; a gap of tens
    of microseconds means the next launch had not been issued: the host, or a wait, held the GPU up."""
    total, cur_end = 0.0, None
    for start, end in spans:
        if cur_end is not None and start - cur_end >= threshold_us:
            total += start - cur_end
        cur_end = end if cur_end is None else max(cur_end, end)
    return total


def profile_steps(llm, steps: int) -> dict:
    """Profile the engine's next `steps` steps (requests already added): the GPU's idle fraction between
    the first and last kernel, the time per step, and the kernels that take most of it; and the same for
    the admission phase alone ("admission": the steps while requests wait, i.e. the prefill and mixed
    steps, whose kernels the decode steps' would otherwise hide). The phases are profiled one after the
    other, so the overall figures add the two windows, not the moment between them. idle_fraction counts
    every gap between kernels; stall_fraction only the gaps of STALL_US or more (the GPU without work,
    rather than between two launches of one step)."""
    torch.cuda.synchronize()
    phases, done = [], 0
    for name, more in (("admission", lambda: bool(llm.scheduler.waiting)), ("rest", lambda: True)):
        n = 0
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            while not llm.scheduler.is_finished() and done < steps and more():
                llm.step()
                n += 1
                done += 1
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
        if n:
            spans = busy_intervals(prof)
            phases.append((name, prof, n, wall, spans[-1][1] - spans[0][0], union_length(spans),
                           stall_length(spans)))

    def summary(parts) -> dict:
        n, wall = sum(p[2] for p in parts), sum(p[3] for p in parts)
        window, busy, stalls = (sum(p[i] for p in parts) for i in (4, 5, 6))
        return {"steps": n, "wall_ms_per_step": round(1e3 * wall / n, 3),
                "gpu_busy_ms_per_step": round(busy / 1e3 / n, 3), "idle_fraction": round(1 - busy / window, 4),
                "stall_fraction": round(stalls / window, 4),
                "top_kernels_ms_per_step": top_kernels([p[1] for p in parts], n, 8)}

    result = summary(phases)
    admission = [p for p in phases if p[0] == "admission"]
    if admission:
        result["admission"] = summary(admission)
    return result


def requests(args) -> list[tuple[list[int], int]]:
    random.seed(0)
    if args.bench_workload:
        from bench import workload  # the repository root's bench.py
        return list(zip(*workload(args.num_seqs, 1024, 1024)))
    return [([random.randint(0, 10000) for _ in range(args.prompt_len)], args.steps * 3)
            for _ in range(args.num_seqs)]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=shipped_config_dir("Qwen3-0.6B"))
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--bench-workload", action="store_true",
                        help="bench.py's 256 requests; profile every decode step to the end")
    parser.add_argument("--awq", action="store_true",
                        help="the model with an AutoAWQ 4-bit quantization_config (random weights, group 128)")
    parser.add_argument("--top", type=int, default=12, help="kernels listed, most expensive first")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = with_awq_config(args.model) if args.awq else args.model
    try:
        llm = LLM(model, load_format="dummy", max_num_seqs=args.num_seqs, enforce_eager=args.enforce_eager,
                  kv_cache_dtype=args.kv_cache_dtype)
    except ValueError as e:
        parser.error(str(e))
    for prompt, max_tokens in requests(args):
        llm.add_request(prompt, SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=max_tokens))
    while llm.scheduler.waiting:
        llm.step()
    for _ in range(5):
        llm.step()
    torch.cuda.synchronize()
    steps = 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        while not llm.scheduler.is_finished() and (args.bench_workload or steps < args.steps):
            llm.step()
            steps += 1
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    args.steps = steps
    spans = busy_intervals(prof)
    window = spans[-1][1] - spans[0][0]
    busy = union_length(spans)
    record = {"num_seqs": args.num_seqs, "steps": args.steps, "bench_workload": args.bench_workload,
              "wall_ms_per_step": 1e3 * wall / args.steps,
              "gpu_busy_ms_per_step": busy / 1e3 / args.steps, "idle_fraction": round(1 - busy / window, 4),
              "stall_fraction": round(stall_length(spans) / window, 4),
              "enforce_eager": args.enforce_eager, "kv_cache_dtype": args.kv_cache_dtype,
              "gpu": torch.cuda.get_device_name(),
              "model": os.path.basename(args.model.rstrip("/")), "awq": args.awq,
              "top_kernels_ms_per_step": top_kernels([prof], args.steps, args.top),
              "command": "python " + " ".join(sys.argv),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if args.out:
        save_record(record, args.out)
    else:
        print(json.dumps(record))


if __name__ == "__main__":
    main()
