"""One AWQ linear layer on the GPU: fused dequant-GEMM, GEMV (up to 16 tokens), dequantize + cuBLAS, and bf16
cuBLAS, by token count.

`python tests/awq/bench_gemm.py` times Qwen3-8B's qkv, gate_up and down shapes at M = 1..4096 tokens on
the GPU (CUDA events around a CUDA graph that calls the method once on each of several copies of the layer,
so that the weights come from memory, not the L2 cache, and CPU launch costs stay out, as in the model), and
writes benchmark_results/quantization_int_4/awq_gemm.json.
With --write, the fastest method per token count, per layer shape and summed over the three layers (for
shapes not measured), goes to nanovllm/quant/tuned/awq-<GPU>.json, which `awq_gemm` then follows on that GPU
model; `--from FILE --write` derives it from a saved awq_gemm.json without timing again. The 4-bit weight is
3.9x fewer bytes than bf16, so at small M (memory-bound) the fused kernel should be well under bf16's time.
"""
import argparse
import json
import os
import sys
from datetime import datetime, timezone

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from nanovllm.quant.awq_quantize import to_awq_tensors  # noqa: E402
from nanovllm.quant.triton_awq import AWQ_METHODS, awq_dequantize, awq_gemm, tuned_methods_path  # noqa: E402
from nanovllm.utils.results import save_record  # noqa: E402

TIMING_KEYS = {"fused": "fused_us", "gemv": "gemv_us", "dequant": "dequant_matmul_us"}
SHAPES = {"qkv (8B)": (4096, 6144), "gate_up (8B)": (4096, 24576), "down (8B)": (12288, 4096)}


# One CUDA graph replay calls the method on each copy of the layer in turn, so that the weights come from
# memory, not from the L2 cache (50-60 MB on an H100/H200) filled by the previous call, as in the model,
# where the other layers' weights pass through L2 between two calls of one layer.
L2_FLUSH_BYTES = 256 << 20


def layer_copy(k: int, n: int) -> tuple[dict, torch.Tensor]:
    """(AWQ tensors, bf16 weight [k, n]) of one random layer."""
    w = torch.randn(n, k, device="cuda") * 0.02
    return to_awq_tensors(w, 128), w.t().contiguous().to(torch.bfloat16)


def time_us(layers: list, fn) -> float:
    """Median GPU microseconds of fn(awq_tensors, bf16_weight) per copy of the layer: one call per copy,
    captured in one CUDA graph and replayed, so that the CPU's launch cost (tens of microseconds for a
    Triton kernel and its buffers, more than a small kernel's GPU time) is left out, as in the engine's
    decode graphs."""
    def one_pass():
        for layer in layers:
            fn(*layer)
    one_pass()                                   # compile before capturing
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        one_pass()
    us = 1e3 * triton.testing.do_bench(graph.replay, warmup=10, rep=50, return_mode="median") / len(layers)
    del graph
    return us


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64, 128, 256, 512, 1024, 4096])
    parser.add_argument("--out", default="benchmark_results/quantization_int_4/awq_gemm.json")
    parser.add_argument("--write", action="store_true", help="store the fastest method per token count")
    parser.add_argument("--from", dest="saved", default=None, help="a saved awq_gemm.json to derive the table from")
    args = parser.parse_args()
    if args.saved:
        with open(args.saved) as f:
            record = json.load(f)
        if args.write:
            write_tuned(record, f"{record['command']} (table re-derived by python {' '.join(sys.argv)})")
        return
    rows = []
    for name, (k, n) in SHAPES.items():
        layers = [layer_copy(k, n) for _ in range(max(2, -(-L2_FLUSH_BYTES // (k * n // 2))))]
        dequant_us = time_us(layers, lambda t, _: awq_dequantize(t["qweight"], t["qzeros"], t["scales"], 128,
                                                                 torch.bfloat16))
        for m in args.tokens:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            row = {"layer": name, "k": k, "n": n, "tokens": m, "weight_copies": len(layers),
                   "bf16_us": time_us(layers, lambda _, w_bf16: x @ w_bf16),
                   "fused_us": time_us(layers, lambda t, _: awq_gemm(x, t["qweight"], t["qzeros"], t["scales"], 128,
                                                                     method="fused")),
                   "gemv_us": time_us(layers, lambda t, _: awq_gemm(x, t["qweight"], t["qzeros"], t["scales"], 128,
                                                                    method="gemv")) if m <= 16 else None,
                   "dequant_matmul_us": time_us(layers, lambda t, _: awq_gemm(
                       x, t["qweight"], t["qzeros"], t["scales"], 128, method="dequant")),
                   "dequant_only_us": dequant_us}
            row["bf16_weight_gb_per_s"] = 2 * k * n / row["bf16_us"] / 1e3
            row["fused_weight_gb_per_s"] = 0.5 * k * n / row["fused_us"] / 1e3
            rows.append({key: round(v, 2) if isinstance(v, float) else v for key, v in row.items()})
            print(rows[-1], flush=True)
    record = {"gpu": torch.cuda.get_device_name(), "rows": rows, "command": "python " + " ".join(sys.argv),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "versions": {"torch": torch.__version__, "triton": triton.__version__}}
    save_record(record, args.out)
    if args.write:
        write_tuned(record, record["command"])


def write_tuned(record: dict, command: str) -> None:
    rows = record["rows"]
    by_shape = {f"{k}x{n}": fastest_methods([row for row in rows if (row["k"], row["n"]) == (k, n)])
                for k, n in sorted({(row["k"], row["n"]) for row in rows})}
    save_record({"fastest": fastest_methods(rows), "fastest_by_shape": by_shape, "gpu": record["gpu"],
                 "command": command, "date": record["date"]}, tuned_methods_path(record["gpu"]))


def fastest_methods(rows: list[dict]) -> dict[str, str]:
    """token count -> the method with the least total time over the layers measured at that count."""
    fastest = {}
    for tokens in sorted({row["tokens"] for row in rows}):
        at = [row for row in rows if row["tokens"] == tokens]
        totals = {method: sum(row[TIMING_KEYS[method]] for row in at) for method in AWQ_METHODS
                  if all(row[TIMING_KEYS[method]] is not None for row in at)}
        fastest[str(tokens)] = min(totals, key=totals.get)
    return fastest


if __name__ == "__main__":
    main()
