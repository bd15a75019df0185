"""Decode attention over bench.py's decode steps, timed in CUDA graphs: which launch settings and split-KV
factor each batch size wants.

    python benchmarks/bench_decode_steps.py [--model Qwen3-0.6B] [--kv-cache-dtype auto int8 fp8] [--every 32]
        [--splits 1 2 4 8] [--settings 64/2/3 128/4/2 ...] [--long 64x8192] [--write]
    python benchmarks/bench_decode_steps.py --recompute decode-steps.json --write   # no GPU

bench.py's batch starts at 256 sequences and shrinks as they finish (max_tokens 100..1,024) while their
contexts grow (prompts 100..1,024). Every --every-th decode step is rebuilt here as the CUDA graph runs it
(padded to the graph's batch size, padding rows of context 0, longest first) and one layer's decode attention
is timed for each launch setting (block_n/num_warps/num_stages: the engine's and --settings) at each split
factor, combine kernel included, replayed from a CUDA graph (eager launches would time the host). The
step's time stands for --every steps; summed over the run and times the model's 28 layers it is the run's
decode-attention seconds for each policy: the engine's (its settings and num_decode_splits per step), each
setting with the engine's split factors, and the best variant per graph batch size.
--write stores, per dtype, settings per launch size (programs per SM, which the graph batch size fixes) in
nanovllm/attention/tuned/decode-<GPU>.json: each size's fastest over its steps (and over --long batches,
so that long contexts at that size count too), when they save 1% of the run over the tuned ones or only
move a threshold; at the top level for head_dim 128, under "by_head_dim" for another (e.g. --model
Llama-3.2-1B, head_dim 64). --recompute chooses them again from a saved JSON.
The attention shape (heads, KV heads, head_dim, layers) is --model's, a shipped config (default
Qwen3-0.6B); writes results/kv_int8_cache/decode-steps.json (untracked) or --out.
"""
import argparse
import json
import math
import os
import sys
from collections import defaultdict
from datetime import datetime, timezone

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "tests")]    # bench.py; tests/attention_cases.py
from attention_cases import make_cache  # noqa: E402

from bench import workload  # noqa: E402
from benchmarks.timing import graph_us  # noqa: E402
from nanovllm.attention.metadata import decode_order  # noqa: E402
from nanovllm.attention.triton_decode import (  # noqa: E402
    TUNED_HEAD_DIM,
    decode_attention,
    launch_settings,
    num_decode_splits,
    pick_settings,
    tuned_settings_path,
    tuned_table,
)
from nanovllm.config import load_hf_config  # noqa: E402
from nanovllm.configs import shipped_config_dir  # noqa: E402
from nanovllm.engine.cuda_graph import graph_batch_sizes  # noqa: E402
from nanovllm.models.decoder import head_dim_of  # noqa: E402
from nanovllm.quant.kv import LayerKVCache  # noqa: E402
from nanovllm.utils.results import results_path, save_record  # noqa: E402
from nanovllm.utils.tuned import num_sms as sm_count  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, LAYERS = 16, 8, 128, 256, 28     # Qwen3-0.6B's; --model sets them
MAX_MODEL_LEN = 4096      # bench.py's: the engine plans each graph's splits with it


def set_model_shape(name: str) -> None:
    """Heads, KV heads, head_dim and layers of a shipped config, for every function here."""
    global HEADS, KV_HEADS, HEAD_DIM, LAYERS
    cfg = load_hf_config(shipped_config_dir(name))
    HEADS, KV_HEADS, HEAD_DIM = cfg.num_attention_heads, cfg.num_key_value_heads, head_dim_of(cfg)
    LAYERS = cfg.num_hidden_layers


def bench_steps(every: int) -> list[tuple[int, list[int]]]:
    """(step, context lengths of the running sequences) for every `every`-th decode step of bench.py."""
    prompts, max_tokens = workload(256, 1024, 1024)
    steps = []
    for step in range(1, max(max_tokens), every):
        # after prefill each sequence holds its prompt and one sampled token; decode step s adds token s + 1
        running = [len(p) + step for p, n in zip(prompts, max_tokens) if n > step]
        steps.append((step, running))
    return steps


def make_layer_cache(kind: str, num_blocks: int) -> LayerKVCache:
    """One layer's cache of random K/V (the kernel tests' attention_cases.make_cache at this shape)."""
    return make_cache((num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM), torch.bfloat16, "cuda", kind)


REPLAYS = 10      # decode calls per CUDA graph


def graph_time_us(fn) -> float:
    """GPU time of one call of fn, REPLAYS calls replayed from a CUDA graph as the engine runs them (eager
    launches of a 30-100 us kernel would time the host's launch cost instead)."""
    return graph_us([fn] * REPLAYS)


def parse_settings(text: str) -> dict:
    block_n, num_warps, num_stages = map(int, text.split("/"))
    return {"block_n": block_n, "num_warps": num_warps, "num_stages": num_stages}


def programs_per_sm(graph_batch: int, splits: int, num_sms: int) -> float:
    """Rounded down, so that a threshold taken from it admits the launch it came from."""
    return math.floor(100 * graph_batch * KV_HEADS * splits / num_sms) / 100


def label(settings: dict) -> str:
    return "/".join(str(settings[key]) for key in ("block_n", "num_warps", "num_stages"))


def time_steps(cache: LayerKVCache, steps, q, tables, variants: list[tuple[str, int]], num_sms: int) -> list[dict]:
    """One layer's decode attention at each sampled step (padded as its CUDA graph runs it), for each
    (launch settings, split factor); each variant's best of two alternating rounds."""
    sizes = graph_batch_sizes(256)
    n = len(steps[0][1])
    first = torch.tensor(steps[0][1], dtype=torch.int32, device="cuda")
    order0 = torch.arange(n, device="cuda").int()
    # compile every variant first (a timing right after a compilation reads slow), and drop any whose output
    # differs from the first's: a broken configuration must not win (INT8 rounds P per tile, so tiles of
    # another length differ slightly)
    ref = decode_attention(q[:n], cache, tables[:n], first, 1.0, variants[0][1], parse_settings(variants[0][0]),
                           order=order0).float()
    atol = 4e-2 if cache.k.dtype == torch.int8 else 2e-2
    for settings, splits in list(variants):
        out = decode_attention(q[:n], cache, tables[:n], first, 1.0, splits, parse_settings(settings), order=order0)
        if not torch.allclose(out.float(), ref, atol=atol, rtol=2e-2):
            print(json.dumps({"dropped": [settings, splits]}), flush=True)
            variants.remove((settings, splits))
    torch.cuda.synchronize()
    per_step = []
    for step, running in steps:
        graph_bs = next(s for s in sizes if s >= len(running))
        lens = running + [0] * (graph_bs - len(running))
        order = torch.from_numpy(decode_order(lens)).cuda()
        ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
        us = defaultdict(dict)
        for _ in range(2):
            for settings, splits in variants:
                t = graph_time_us(lambda: decode_attention(q[:graph_bs], cache, tables[:graph_bs], ctx,
                                                           HEAD_DIM ** -0.5, splits, parse_settings(settings),
                                                           order=order))
                us[settings][splits] = round(min(us[settings].get(splits, 1e9), t), 2)
        splits = num_decode_splits(graph_bs, KV_HEADS, MAX_MODEL_LEN, num_sms)
        per_step.append({"step": step, "batch": len(running), "graph_batch": graph_bs,
                         "mean_context": round(sum(running) / len(running)), "engine_splits": splits,
                         "programs_per_sm": programs_per_sm(graph_bs, splits, num_sms),
                         "engine_settings": label(launch_settings(cache, graph_bs * KV_HEADS * splits)), "us": us})
    return per_step


def totals(per_step: list[dict], every: int) -> dict:
    """Seconds of decode attention per bench.py run (each sampled step stands for `every` steps, 28 layers):
    the engine's policy (its settings and split factor per step), each setting with the engine's split
    factor, and the best variant per graph batch size."""
    scale = every * LAYERS / 1e6
    per_step = [r for r in per_step if isinstance(r["step"], int)]     # bench.py's steps only
    by_graph = defaultdict(lambda: defaultdict(float))
    for r in per_step:
        for settings, by_split in r["us"].items():
            for splits, t in by_split.items():
                by_graph[r["graph_batch"]][(settings, splits)] += t
    best = {bs: min(t, key=t.get) for bs, t in sorted(by_graph.items())}
    return {
        "engine_policy_s": round(scale * sum(r["us"][r["engine_settings"]][r["engine_splits"]] for r in per_step), 4),
        "engine_splits_by_settings_s": {
            settings: round(scale * sum(r["us"][settings][r["engine_splits"]] for r in per_step), 4)
            for settings in per_step[0]["us"]},
        "best_per_graph_batch_s": round(scale * sum(by_graph[bs][v] for bs, v in best.items()), 4),
        "best_per_graph_batch": {bs: f"{settings} x{splits}" for bs, (settings, splits) in best.items()},
    }


SIZE_GAIN = 0.03   # a launch size changes settings only if that saves this much of its steps' time
RUN_GAIN = 0.01    # and new tiers replace the tuned ones only if they save this much of the run


def tuned_tiers(per_step: list[dict], current: str) -> list[tuple[float, str]]:
    """[(least programs per SM, settings)], ascending from 0. Each launch size (programs per SM, which each
    graph batch size fixes) gets the setting with the least time over its steps, bench.py's and --long
    workloads' alike; it keeps the setting of the size below (the current general one for the smallest)
    unless its own best saves SIZE_GAIN there, so that noise does not flip the tuned file."""
    by_size = defaultdict(list)
    for r in per_step:
        by_size[r["programs_per_sm"]].append(r)

    def cost(rows: list[dict], settings: str) -> float:
        return sum(r["us"][settings][r["engine_splits"]] for r in rows)

    tiers = []
    for size in sorted(by_size):
        rows = by_size[size]
        best = min(rows[0]["us"], key=lambda settings: cost(rows, settings))
        below = tiers[-1][1] if tiers else current
        if cost(rows, below) <= (1 + SIZE_GAIN) * cost(rows, best):
            best = below
        if not tiers or best != tiers[-1][1]:
            tiers.append((size if tiers else 0.0, best))
    return tiers


def tiers_total_s(per_step: list[dict], tiers: list[tuple[float, str]] | None, every: int,
                  with_long: bool = False) -> float:
    """Decode-attention seconds per bench.py run with these tiers (None: the engine's settings per step);
    with_long adds the --long batches, each weighed like one sampled step."""
    def pick(r: dict) -> str:
        if tiers is None:
            return r["engine_settings"]
        return [settings for least, settings in tiers if r["programs_per_sm"] >= least][-1]
    return round(every * LAYERS / 1e6 * sum(r["us"][pick(r)][r["engine_splits"]] for r in per_step
                                            if with_long or isinstance(r["step"], int)), 4)


def choose_tiers(record: dict, every: int, current: list[str]) -> dict:
    """The record's tiers, their run total, and whether they replace the tuned ones (`current`: their
    settings, smallest launches first): if they save RUN_GAIN over the engine's settings, bench.py's steps
    and the --long batches counted together, or change only the thresholds."""
    steps = record["steps"]
    tiers = tuned_tiers(steps, current[0])
    saves = tiers_total_s(steps, tiers, every, True) < (1 - RUN_GAIN) * tiers_total_s(steps, None, every, True)
    return {"tiers": tiers, "tiers_s": tiers_total_s(steps, tiers, every),
            "tiers_replace_tuned": saves or [settings for _, settings in tiers] == current}


def write_tuned(records: list[dict], command: str, gpu: str, head_dim: int = TUNED_HEAD_DIM) -> None:
    """Store each dtype's tiers in nanovllm/attention/tuned/decode-<GPU>.json: the first as its general
    settings, the others under "many_programs" with their least programs per SM; at the top level for
    head_dim 128, else under "by_head_dim"."""
    table = dict(tuned_table(gpu))
    table.pop("note", None)          # it described the values being replaced
    by_head_dim = dict(table.get("by_head_dim", {}))
    entry = table if head_dim == TUNED_HEAD_DIM else dict(by_head_dim.get(str(head_dim), {}))
    settings, many_programs = dict(entry.get("settings", {})), dict(entry.get("many_programs", {}))
    for rec in (r for r in records if r["tiers_replace_tuned"]):
        kind, tiers = rec["kv_cache_dtype"], rec["tiers"]
        settings[kind] = parse_settings(tiers[0][1])
        many_programs.pop(kind, None)
        if len(tiers) > 1:
            many_programs[kind] = [{"min_programs_per_sm": least, **parse_settings(s)} for least, s in tiers[1:]]
    if head_dim == TUNED_HEAD_DIM:
        table.update(settings=settings, many_programs=many_programs)
    else:
        by_head_dim[str(head_dim)] = {"settings": settings, "many_programs": many_programs}
        table["by_head_dim"] = by_head_dim
    table.update(gpu=gpu, command=command, date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    save_record(table, tuned_settings_path(gpu))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="Qwen3-0.6B", help="a shipped config: the attention shape")
    parser.add_argument("--kv-cache-dtype", nargs="+", default=["auto", "int8", "fp8"])
    parser.add_argument("--every", type=int, default=32)
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--settings", nargs="*", default=[],
                        help="launch settings block_n/num_warps/num_stages to time besides the tuned ones")
    parser.add_argument("--out", default=results_path("kv_int8_cache", "decode-steps.json"))
    parser.add_argument("--long", nargs="*", default=[], metavar="BATCHxCONTEXT",
                        help="uniform long-context batches (e.g. 64x8192) weighed like one sampled step each "
                             "when tiers are chosen (not in the run totals)")
    parser.add_argument("--recompute", metavar="JSON",
                        help="choose the tiers again from a JSON this script wrote (no GPU needed)")
    parser.add_argument("--write", action="store_true",
                        help="store each dtype's settings per launch size in "
                             "nanovllm/attention/tuned/decode-<GPU>.json")
    args = parser.parse_args()
    if args.recompute:
        with open(args.recompute) as f:
            meta = json.load(f)
        set_model_shape(meta.get("model", "Qwen3-0.6B"))
        records = meta.pop("records")
        table = tuned_table(meta["gpu"])
        for rec in records:
            for r in rec["steps"]:
                r["programs_per_sm"] = programs_per_sm(r["graph_batch"], r["engine_splits"], meta.get("num_sms", 132))
                r["us"] = {settings: {int(n): t for n, t in by_split.items()} for settings, by_split in r["us"].items()}
            current = list(dict.fromkeys(label(pick_settings(table, rec["kv_cache_dtype"], per_sm, HEAD_DIM))
                                         for per_sm in range(64)))
            rec.update(choose_tiers(rec, meta["every"], current))
        meta["tiers_recomputed_by"] = "python " + " ".join(sys.argv)
    else:
        set_model_shape(args.model)
        meta, records = measure(args)
    with open(args.out, "w") as f:
        json.dump({**meta, "records": records}, f, indent=1)
    if args.write:
        write_tuned(records, meta.get("tiers_recomputed_by", meta["command"]) + f" (timings: {meta['command']}, "
                    f"{meta['date']})", meta["gpu"], HEAD_DIM)


def measure(args) -> tuple[dict, list[dict]]:
    num_sms = sm_count(torch.device("cuda", 0))
    steps = bench_steps(args.every)
    for shape in args.long:
        batch, context = map(int, shape.split("x"))
        steps.append((shape, [context] * batch))
    max_blocks = max(MAX_MODEL_LEN, *(max(lens) for _, lens in steps)) // BLOCK_SIZE
    tables = torch.randperm(256 * max_blocks, device="cuda").view(256, max_blocks).int()
    q = torch.randn(256, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    records = []
    for kind in args.kv_cache_dtype:
        cache = make_layer_cache(kind, 256 * max_blocks)
        engine = list(dict.fromkeys(label(launch_settings(cache, per_sm * num_sms)) for per_sm in range(64)))
        variants = [(s, n) for s in dict.fromkeys([*engine, *args.settings]) for n in args.splits]
        per_step = time_steps(cache, steps, q, tables, variants, num_sms)
        for r in per_step:
            print(json.dumps({"kv": kind, **r}), flush=True)
        records.append({"kv_cache_dtype": kind, **totals(per_step, args.every), "steps": per_step})
        records[-1].update(choose_tiers(records[-1], args.every, engine))
        print(json.dumps({k: v for k, v in records[-1].items() if k != "steps"}), flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "num_sms": num_sms, "command": "python " + " ".join(sys.argv),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "every": args.every,
            "model": args.model, "head_dim": HEAD_DIM, "layers": LAYERS}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    return meta, records

if __name__ == "__main__":
    main()
