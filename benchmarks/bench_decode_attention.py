"""Decode-attention microbenchmark: effective bandwidth of the split-KV kernel per KV cache dtype.

    python benchmarks/bench_decode_attention.py [--batch 64] [--context 8192] [--context-min N] [--sweep]

Qwen3-0.6B attention shape (16 query heads, 8 KV heads, head_dim 128), one layer, blocks scattered over
the pool. Every sequence has --context tokens, or with --context-min a length drawn uniformly from
[context-min, context] (bench.py's decode batches hold 100 to 2,048); the kernel then runs in the engine's
launch order (longest first), and the record also gives the time in batch order. Bytes counted = K and V
values (and scales) of every context token, read once; the query and output are negligible. Prints one
JSON line per dtype and writes them under --out-dir (default results/kv_int8_cache/, untracked).
--sweep instead times each cache dtype over launch settings (keys per tile, warps, stages, register cap) and prints
the fastest (every timing goes to decode-sweep-*.json); --write stores the winners as the general settings in
nanovllm/attention/tuned/decode-<GPU>.json, which decode_attention reads on that GPU model. These timings
are eager (do_bench); the shipped table comes from benchmarks/bench_decode_steps.py --write, which times
bench.py's own decode steps in CUDA graphs and can give launches of many programs their own settings.
"""
import argparse
import itertools
import json
import os
import sys
from datetime import datetime, timezone

import torch
from triton.testing import do_bench

from nanovllm.attention.metadata import decode_order
from nanovllm.attention.triton_decode import (
    DEFAULT_SETTINGS,
    TUNED_DIR,
    decode_attention,
    num_decode_splits,
    tuned_settings_path,
)
from nanovllm.quant.kv import LayerKVCache, quantize_ref, quantized_cache
from nanovllm.utils.results import results_path, save_record
from nanovllm.utils.tuned import read_tuned


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--context-min", type=int, default=None, help="vary lengths in [context-min, context]")
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--kv-cache-dtype", nargs="+", default=["auto", "int8", "fp8"])
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--write", action="store_true", help="with --sweep: store the winners for this GPU model")
    parser.add_argument("--out-dir", default=results_path("kv_int8_cache"))
    args = parser.parse_args()
    heads, kv_heads, head_dim, bs = 16, 8, 128, args.block_size
    blocks_per_seq = args.context // bs
    num_blocks = args.batch * blocks_per_seq
    tables = torch.randperm(num_blocks, device="cuda").view(args.batch, blocks_per_seq).int()
    if args.context_min is None:
        context_lens = torch.full((args.batch,), args.context, dtype=torch.int32)
    else:
        context_lens = torch.randint(args.context_min, args.context + 1, (args.batch,), dtype=torch.int32,
                                     generator=torch.Generator().manual_seed(0))
    order = torch.from_numpy(decode_order(context_lens.numpy())).cuda()
    context_lens = context_lens.cuda()
    tokens = int(context_lens.sum())
    q = torch.randn(args.batch, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    shape = (num_blocks, bs, kv_heads, head_dim)
    k, v = (torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    splits = num_decode_splits(args.batch, kv_heads, args.context,
                               torch.cuda.get_device_properties(0).multi_processor_count)
    records, best = [], {}
    for kind in args.kv_cache_dtype:
        if kind == "auto":
            cache = LayerKVCache(k, v)
        else:
            (kq, ks), (vq, vs) = quantize_ref(k, kind), quantize_ref(v, kind)
            cache = quantized_cache(kq, vq, ks, vs)
        if args.sweep:
            rows = sweep(q, cache, kind, tables, context_lens, splits, order)
            best[kind] = {key: rows[0][key] for key in (*DEFAULT_SETTINGS, "maxnreg") if rows[0].get(key)}
            records += rows
            continue
        ms = do_bench(lambda: decode_attention(q, cache, tables, context_lens, head_dim ** -0.5, splits, order=order),
                      warmup=50, rep=300, return_mode="median")
        unordered_ms = do_bench(lambda: decode_attention(q, cache, tables, context_lens, head_dim ** -0.5, splits),
                                warmup=50, rep=300, return_mode="median")
        nbytes = context_bytes(cache, tokens)
        records.append({"kv_cache_dtype": kind, "batch": args.batch, "context": args.context,
                        "context_min": args.context_min, "splits": splits, "ms": ms, "unordered_ms": unordered_ms,
                        "bytes": nbytes, "tb_per_s": nbytes / ms / 1e9, "gpu": torch.cuda.get_device_name(),
                        "command": "python " + " ".join(sys.argv),
                        "date": now()})
        print(json.dumps(records[-1]))
    os.makedirs(args.out_dir, exist_ok=True)
    name = f"b{args.batch}-c{args.context}" + (f"-min{args.context_min}" if args.context_min is not None else "")
    if args.sweep:
        command = "python " + " ".join(sys.argv)
        if args.write:
            write_tuned(best, command)
        with open(os.path.join(args.out_dir, f"decode-sweep-{name}.json"), "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "command": command, "date": now(), "batch": args.batch,
                       "context": args.context, "context_min": args.context_min, "splits": splits,
                       "timings": records}, f, indent=2)
        return
    with open(os.path.join(args.out_dir, f"decode-attention-{name}.json"), "w") as f:
        json.dump(records, f, indent=2)


def context_bytes(cache: LayerKVCache, tokens: int) -> int:
    """K and V bytes (scales included) of `tokens` cached tokens of one layer."""
    slots = cache.k.shape[0] * cache.k.shape[1]
    return sum(t.numel() * t.element_size() for t in (cache.k, cache.v, cache.k_scale, cache.v_scale)
               if t is not None) * tokens // slots


# Register caps per thread (None: the compiler's choice). Fewer registers let more programs share an SM,
# which hides more memory latency when a batch has many more programs than the GPU holds at once.
MAXNREG = (None, 128, 96)


def sweep(q, cache, kind, tables, context_lens, splits, order) -> list[dict]:
    """Time every launch setting on this cache; settings whose output differs from the default's are
    dropped (a broken configuration must not win). Returns one row per setting (its keys, ms, TB/s),
    fastest first."""
    ref = decode_attention(q, cache, tables, context_lens, 0.1, splits, DEFAULT_SETTINGS)
    nbytes = context_bytes(cache, int(context_lens.sum()))
    # INT8 rounds the probabilities per row of each key tile, so a tile of another length rounds them
    # differently (H200: up to 0.012 apart between 64 and 128 keys, each within the reference's error)
    atol = 4e-2 if kind == "int8" else 2e-2
    candidates = []
    for block_n, num_warps, num_stages, maxnreg in itertools.product((32, 64, 128), (2, 4, 8), (2, 3), MAXNREG):
        settings = {"block_n": block_n, "num_warps": num_warps, "num_stages": num_stages, "maxnreg": maxnreg}
        out = decode_attention(q, cache, tables, context_lens, 0.1, splits, settings, order)     # compiles it
        if not torch.allclose(out.float(), ref.float(), atol=atol, rtol=2e-2):
            print(json.dumps({"dropped": settings, "kv_cache_dtype": kind}))
            continue
        candidates.append(settings)
    # Timed only once every setting is compiled, in two rounds, each setting's best kept: a setting timed
    # right after a compilation (the GPU idle meanwhile) read up to ~15% slow on the H200
    # (git show 11b49a5:benchmark_results/kv_int8_cache/experiments/decode-programs-2026-12-04.json)
    times = [[] for _ in candidates]
    for _ in range(2):
        for settings, ms in zip(candidates, times):
            ms.append(do_bench(lambda: decode_attention(q, cache, tables, context_lens, 0.1, splits, settings, order),
                               warmup=10, rep=50, return_mode="median"))
    rows = [{"kv_cache_dtype": kind, **settings, "ms": min(ms), "tb_per_s": nbytes / min(ms) / 1e9}
            for settings, ms in zip(candidates, times)]
    rows.sort(key=lambda row: row["ms"])
    for row in rows[:3]:
        print(json.dumps({**row, "batch": len(context_lens), "context": int(context_lens.max()), "splits": splits}))
    return rows


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_tuned(best: dict[str, dict], command: str) -> None:
    """Merge into the package's tuned settings for this GPU model (read by decode_attention)."""
    gpu = torch.cuda.get_device_name()
    record = read_tuned(TUNED_DIR, "decode", gpu)
    record["settings"] = {**record.get("settings", {}), **best}
    record.update(gpu=gpu, command=command, date=now())
    save_record(record, tuned_settings_path(gpu))


if __name__ == "__main__":
    main()
