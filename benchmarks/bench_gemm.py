"""One AWQ linear layer on the GPU: the GEMV kernel (up to 8 tokens), the fused tensor-core kernel, the
Hopper wgmma kernel (quant/gluon_awq_mma.py), dequantize + cuBLAS, and bf16 cuBLAS, by token count.

`python benchmarks/bench_gemm.py` times the linear layers of Qwen3-8B and Qwen3-0.6B at M = 1..4096 tokens
(GPU time: CUDA events around a CUDA graph that calls the method once on each of several copies of the
layer, so that the weights come from memory, not the L2 cache, and CPU launch costs stay out, as in the
model) and writes results/quantization_int_4/awq_gemm.json (untracked) or --out. --sweep-gemv first times the GEMV
kernel's settings (columns per program, split-K, warps) per shape and token count and keeps the fastest;
at one token, where the Gluon GEMV (quant/gluon_awq_gemv.py) is what "gemv" runs, also its split-K, and the
Triton kernel's time is kept beside it as `triton_gemv_us`.
With --write, the fastest method per token count (per layer shape, and summed over the layers for shapes
not measured) and the GEMV settings go to nanovllm/quant/tuned/awq-<GPU>.json, which `awq_gemm` then
follows on that GPU model; `--from FILE... --write` merges saved awq_gemm JSONs into --out and derives
the table from them. The 4-bit weight is 3.9x fewer bytes than bf16, so at a few tokens (memory-bound) AWQ
should take well under bf16's time: `*_weight_gb_per_s` give each method's bandwidth on the bytes it reads.
"""
import argparse
import functools
import json
import os
import sys
from datetime import datetime, timezone

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository root
from benchmarks.timing import graph_us  # noqa: E402
from nanovllm.quant.awq import kernel_layout  # noqa: E402
from nanovllm.quant.awq_quantize import to_awq_tensors  # noqa: E402
from nanovllm.quant.gluon_awq_gemv import BLOCK_N as GLUON_BLOCK_N  # noqa: E402
from nanovllm.quant.gluon_awq_gemv import gluon_awq_gemv, gluon_supported  # noqa: E402
from nanovllm.quant.triton_awq import (  # noqa: E402
    AWQ_METHODS,
    GEMV_MAX_TOKENS,
    awq_dequantize,
    awq_gemm,
    split_k_for,
    supported_methods,
    tuned_methods_path,
)
from nanovllm.quant.triton_awq_gemv import awq_gemv  # noqa: E402
from nanovllm.utils.results import results_path, save_record  # noqa: E402

TIMING_KEYS = {"fused": "fused_us", "gemv": "gemv_us", "mma": "mma_us", "mma256": "mma256_us",
               "dequant": "dequant_matmul_us"}
SHAPES = {"8B": {"qkv (8B)": (4096, 6144), "o (8B)": (4096, 4096), "gate_up (8B)": (4096, 24576),
                 "down (8B)": (12288, 4096)},
          "0.6B": {"qkv (0.6B)": (1024, 4096), "o (0.6B)": (2048, 1024), "gate_up (0.6B)": (1024, 6144),
                   "down (0.6B)": (3072, 1024)}}


# One CUDA graph replay calls the method on each copy of the layer in turn, so that the weights come from
# memory, not from the L2 cache (50-60 MB on an H100/H200) filled by the previous call, as in the model,
# where the other layers' weights pass through L2 between two calls of one layer.
L2_FLUSH_BYTES = 256 << 20


def layer_copy(k: int, n: int) -> tuple[dict, torch.Tensor]:
    """(AWQ tensors in the kernel layout, bf16 weight [k, n]) of one random layer."""
    w = torch.randn(n, k, device="cuda") * 0.02
    return kernel_layout(to_awq_tensors(w, 128), 128), w.t().contiguous().to(torch.bfloat16)


def time_us(layers: list, fn) -> float:
    """Median GPU microseconds of fn(awq_tensors, bf16_weight) per copy of the layer: one call per copy,
    all in one CUDA graph (benchmarks/timing.py), as in the engine's decode graphs."""
    return graph_us([functools.partial(fn, *layer) for layer in layers])


def time_settings(layers: list, calls: dict, rounds: int = 2, timer=time_us) -> dict:
    """{setting: GPU microseconds} for {setting: fn(awq_tensors, bf16_weight)}: every setting compiled before
    any is timed, then timed in `rounds` rounds, each setting's best kept (in a fresh process the first
    setting timed reads slow, which decided sweeps for the decode kernel; tests/kv_quant)."""
    for fn in calls.values():
        fn(*layers[0])
    best = {}
    for _ in range(rounds):
        for setting, fn in calls.items():
            best[setting] = min(best.get(setting, float("inf")), timer(layers, fn))
    return best


def sweep_gemv(layers: list, x: torch.Tensor, k: int, n: int) -> tuple[list[int], list[dict]]:
    """The fastest [block_n, split_k, num_warps] for the Triton GEMV kernel, and every timing."""
    num_warps = 4                                   # 4 won most H200 sweeps that also tried 2 and 8 warps
    settings = {(block_n, split_k_for(per_sm, triton.cdiv(n, block_n), k // 128, x.device), num_warps)
                for block_n in (64, 128) for per_sm in (1, 2, 4, 8)}
    calls = {(b, s, w): functools.partial(triton_gemv, x, b, s, w) for b, s, w in sorted(settings)}
    timings = [{"block_n": b, "split_k": s, "num_warps": w, "us": round(us, 2)}
               for (b, s, w), us in time_settings(layers, calls).items()]
    best = min(timings, key=lambda row: row["us"])
    return [best["block_n"], best["split_k"], best["num_warps"]], timings


def triton_gemv(x: torch.Tensor, block_n: int, split_k: int, num_warps: int, t: dict, _) -> torch.Tensor:
    return awq_gemv(x, t["qweight"], t["zeros"], t["scales"], 128, block_n=block_n, split_k=split_k,
                    num_warps=num_warps, kernel="triton")


def sweep_gluon(layers: list, x: torch.Tensor, k: int, n: int) -> tuple[int, list[dict]]:
    """The fastest split-K for the Gluon GEMV (one token), and every timing."""
    tiles = triton.cdiv(n, GLUON_BLOCK_N)
    splits = sorted({split_k_for(per_sm, tiles, k // 128, x.device) for per_sm in (2, 3, 4, 6, 8)})
    calls = {split_k: functools.partial(gluon_gemv, x, split_k) for split_k in splits}
    timings = [{"split_k": split_k, "us": round(us, 2)} for split_k, us in time_settings(layers, calls).items()]
    return min(timings, key=lambda row: row["us"])["split_k"], timings


def gluon_gemv(x: torch.Tensor, split_k: int, t: dict, _) -> torch.Tensor:
    return gluon_awq_gemv(x, t["qweight"], t["zeros"], t["scales"], split_k)


def time_methods(layers: list, x: torch.Tensor, k: int, n: int, gemv_settings: list[int] | None,
                 gluon_split: int | None = None) -> dict:
    """GPU microseconds per method; "gemv" at the settings given (the Gluon kernel's split where it runs)."""
    m = x.shape[0]
    gemv = dict(zip(("block_n", "split_k", "num_warps"), gemv_settings or []))
    row = {"bf16_us": time_us(layers, lambda _, w_bf16: x @ w_bf16)}
    if gluon_supported(x, 128):     # "gemv" is then the Gluon kernel: the Triton one for comparison
        row["triton_gemv_us"] = time_us(layers, lambda t, _: awq_gemv(x, t["qweight"], t["zeros"], t["scales"], 128,
                                                                      kernel="triton", **gemv))
    for method, key in TIMING_KEYS.items():
        runs = method in supported_methods(m, 128, x)
        settings = {} if method != "gemv" else ({"split_k": gluon_split} if gluon_supported(x, 128) else gemv)
        row[key] = time_us(layers, lambda t, _: awq_gemm(x, t["qweight"], t["zeros"], t["scales"], 128,
                                                          method=method, **settings)) if runs else None
    row["bf16_weight_gb_per_s"] = 2 * k * n / row["bf16_us"] / 1e3
    for method, key in TIMING_KEYS.items():
        if row[key] is not None:       # the 4-bit weight plus fp16 scales and zeros (4 bytes per group)
            row[f"{method}_weight_gb_per_s"] = (0.5 + 4 / 128) * k * n / row[key] / 1e3
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64, 128, 192, 256, 1024, 4096])
    parser.add_argument("--models", nargs="+", default=["8B", "0.6B"], choices=list(SHAPES))
    parser.add_argument("--sweep-gemv", action="store_true", help="time the GEMV kernel's settings first")
    parser.add_argument("--out", default=results_path("quantization_int_4", "awq_gemm.json"))
    parser.add_argument("--write", action="store_true", help="store the fastest method per token count")
    parser.add_argument("--from", dest="saved", nargs="+", default=None,
                        help="saved awq_gemm.json files (e.g. one per model) to merge and derive the table from")
    args = parser.parse_args()
    if args.saved:
        record = merge_saved(args.saved)
        save_record(record, args.out)
        if args.write:
            write_tuned(record, f"{record['command']} (table derived by python {' '.join(sys.argv)})")
        return
    rows = []
    for name, (k, n) in ((name, shape) for model in args.models for name, shape in SHAPES[model].items()):
        layers = [layer_copy(k, n) for _ in range(max(2, -(-L2_FLUSH_BYTES // (k * n // 2))))]
        dequant_us = time_us(layers, lambda t, _: awq_dequantize(t["qweight"], t["zeros"], t["scales"], 128,
                                                                 torch.bfloat16))
        for m in args.tokens:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            settings, sweep = sweep_gemv(layers, x, k, n) if args.sweep_gemv and m <= GEMV_MAX_TOKENS else (None, None)
            gluon_split, gluon_sweep = (sweep_gluon(layers, x, k, n) if args.sweep_gemv and gluon_supported(x, 128)
                                        else (None, None))
            row = {"layer": name, "k": k, "n": n, "tokens": m, "weight_copies": len(layers),
                   **time_methods(layers, x, k, n, settings, gluon_split), "dequant_only_us": dequant_us}
            row = {key: round(v, 2) if isinstance(v, float) else v for key, v in row.items()}
            if settings:
                row.update(gemv_settings=settings, gemv_sweep=sweep)
            if gluon_split:
                row.update(gluon_split_k=gluon_split, gluon_sweep=gluon_sweep)
            rows.append(row)
            print({key: v for key, v in row.items() if key != "gemv_sweep"}, flush=True)
        del layers
    record = {"gpu": torch.cuda.get_device_name(), "rows": rows, "command": "python " + " ".join(sys.argv),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "versions": {"torch": torch.__version__, "triton": triton.__version__}}
    save_record(record, args.out)
    if args.write:
        write_tuned(record, record["command"])


def merge_saved(paths: list[str]) -> dict:
    """The rows of all files; a layer and token count measured again in a later file replaces the earlier row."""
    records = []
    for path in paths:
        with open(path) as f:
            records.append(json.load(f))
    rows = {(row["k"], row["n"], row["tokens"]): row for record in records for row in record["rows"]}
    return {**records[-1], "rows": list(rows.values()),
            "command": " + ".join(record["command"] for record in records)}


def write_tuned(record: dict, command: str) -> None:
    rows = record["rows"]
    by_shape = {f"{k}x{n}": fastest_methods([row for row in rows if (row["k"], row["n"]) == (k, n)])
                for k, n in sorted({(row["k"], row["n"]) for row in rows})}
    gemv = {}
    for row in rows:
        if row.get("gemv_settings"):
            gemv.setdefault(f"{row['k']}x{row['n']}", {})[str(row["tokens"])] = row["gemv_settings"]
    gluon = {f"{row['k']}x{row['n']}": row["gluon_split_k"] for row in rows if row.get("gluon_split_k")}
    save_record({"fastest": fastest_methods(rows), "fastest_by_shape": by_shape, "gemv_by_shape": gemv,
                 "gluon_gemv_by_shape": gluon, "gpu": record["gpu"], "command": command, "date": record["date"]},
                tuned_methods_path(record["gpu"]))


def fastest_methods(rows: list[dict]) -> dict[str, str]:
    """token count -> the method with the least total time over the layers measured at that count."""
    fastest = {}
    for tokens in sorted({row["tokens"] for row in rows}):
        at = [row for row in rows if row["tokens"] == tokens]
        totals = {method: sum(row[TIMING_KEYS[method]] for row in at) for method in AWQ_METHODS
                  if all(row.get(TIMING_KEYS[method]) is not None for row in at)}
        fastest[str(tokens)] = min(totals, key=totals.get)
    return fastest


if __name__ == "__main__":
    main()
