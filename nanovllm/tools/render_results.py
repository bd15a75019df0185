"""Render README's results table from benchmark_results/ JSON: `python -m nanovllm.tools.render_results
[--charts]` (--charts also draws the PNGs of tools/charts.py).

Figures are never typed by hand: each row is one JSON file written by bench.py (machine, command and date
inside). The table replaces whatever stands between the two marker comments in README.md.
"""
import argparse
import os

import torch

from nanovllm.quant import kv as kv_quant
from nanovllm.utils.results import WORKLOAD_ORDER, latest_bench, load_records, workload_label

START, END = "<!-- results:start -->", "<!-- results:end -->"
KV_BYTES_BENCH = 13.85e12   # KV cache bytes the bench workload's decode reads (Qwen3-0.6B, bf16), see docs
BENCH_KV_HEADS, BENCH_HEAD_DIM = 8, 128   # Qwen3-0.6B


def bench_kv_bytes(kv_cache_dtype: str) -> float:
    """KV_BYTES_BENCH for another cache dtype (its scales included)."""
    per_token = kv_quant.bytes_per_token(kv_cache_dtype, torch.bfloat16, BENCH_KV_HEADS, BENCH_HEAD_DIM)
    return KV_BYTES_BENCH * per_token / kv_quant.bytes_per_token("auto", torch.bfloat16, BENCH_KV_HEADS,
                                                                 BENCH_HEAD_DIM)


def bench_rows(root: str) -> list[str]:
    rows = ["| engine | workload | model | GPU | KV dtype | output tokens | seconds | tokens/s | x floor "
            "| steps prefill / mixed / decode | date | file |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path, r in load_records(root, "bench/*.json"):
        model = r["model"] + (" (dummy)" if r.get("load_format") == "dummy" else "")
        steps = r.get("step_stats", {})
        kinds = " / ".join(str(int(steps.get(f"{k}_steps", 0))) for k in ("prefill", "mixed", "decode"))
        ratio = r.get("seconds_over_floor")
        rows.append(f"| {r['engine']} | {workload_label(r)} | {model} | {r['gpu']} "
                    f"| {r['settings'].get('kv_cache_dtype', 'auto')} | {r['output_tokens']} | {r['seconds']:.2f} "
                    f"| {r['tokens_per_s']:,.0f} | {ratio if ratio else '-'} | {kinds if steps else '-'} "
                    f"| {r['date'][:10]} | `{path}` |")
    return rows


def decode_attention_rows(root: str) -> list[str]:
    rows = ["| decode attention | batch x context | ms (longest first) | ms (batch order) | TB/s of cache read "
            "| GPU | file |", "|---|---|---|---|---|---|---|"]
    for path, records in load_records(root, "kv_int8_cache/decode-attention-*.json"):
        for r in records:
            context = str(r["context"]) if r.get("context_min") is None else f"{r['context_min']}..{r['context']}"
            unordered = f"{r['unordered_ms']:.3f}" if "unordered_ms" in r else "-"
            rows.append(f"| {r['kv_cache_dtype']} | {r['batch']} x {context} | {r['ms']:.3f} | {unordered} | "
                        f"{r['tb_per_s']:.2f} | {r.get('gpu', '-')} | `{path}` |")
    return rows if len(rows) > 2 else []


def awq_rows(root: str) -> list[str]:
    rows = ["| AWQ vs bf16 | weight memory AWQ/bf16 | TPOT batch 1 bf16 / AWQ (ms) | AWQ/bf16 TPOT "
            "| batch-256 tok/s bf16 / AWQ | AWQ/bf16 throughput | GPU | date | file |",
            "|---|---|---|---|---|---|---|---|---|"]
    for path, record in load_records(root, "quantization_int_4/awq_vs_bf16*.json"):
        for r in record["rows"]:
            bf16, awq = r["bf16"].get("throughput"), r["awq"].get("throughput")
            speed = (f"{bf16['tokens_per_s']:,.0f} / {awq['tokens_per_s']:,.0f} | {r['throughput_ratio']:.4f}"
                     if bf16 and awq else "- | -")
            rows.append(f"| {r['model']} (dummy) | {r['weight_memory_ratio']:.3f} | "
                        f"{r['bf16']['tpot_ms_batch1']:.2f} / {r['awq']['tpot_ms_batch1']:.2f} | "
                        f"{r['tpot_ratio']:.3f} | {speed} | {r['bf16']['gpu']} | "
                        f"{record['date'][:10]} | `{path}` |")
    return rows if len(rows) > 2 else []


def awq_layer_rows(root: str) -> list[str]:
    """One AWQ linear layer at 1 token (decode, batch 1): GPU microseconds of each method, and the GB/s of
    weight bytes each reads (bf16: 2 bytes per weight; AWQ: 0.5 plus scales and zeros)."""
    rows = ["| AWQ layer, 1 token | bf16 cuBLAS us (GB/s) | AWQ GEMV us (GB/s) | AWQ fused us "
            "| AWQ dequant + cuBLAS us | GPU | file |", "|---|---|---|---|---|---|---|"]
    for path, record in load_records(root, "quantization_int_4/awq_gemm.json"):
        for r in (r for r in record["rows"] if r["tokens"] == 1):
            gemv = f"{r['gemv_us']:.1f} ({r['gemv_weight_gb_per_s']:,.0f})" if r.get("gemv_us") else "-"
            bf16 = f"{r['bf16_us']:.1f} ({r['bf16_weight_gb_per_s']:,.0f})"
            rows.append(f"| {r['layer']} [{r['k']} x {r['n']}] | {bf16} | {gemv} | {r['fused_us']:.1f} | "
                        f"{r['dequant_matmul_us']:.1f} | {record['gpu']} | `{path}` |")
    return rows if len(rows) > 2 else []


def awq_batch_rows(root: str) -> list[str]:
    """One AWQ linear layer at a batch of tokens (decode at batch 16-128), where the Hopper wgmma kernel was
    measured: GPU microseconds of each method."""
    rows = ["| AWQ layer, batch | tokens | bf16 cuBLAS us | AWQ wgmma us | AWQ fused (Triton) us "
            "| AWQ dequant + cuBLAS us | GPU | file |", "|---|---|---|---|---|---|---|---|"]
    for path, record in load_records(root, "quantization_int_4/awq_gemm.json"):
        measured = [r for r in record["rows"] if r.get("mma_us") and r["tokens"] > 1]
        layers = list(dict.fromkeys(r["layer"] for r in measured))
        for r in sorted(measured, key=lambda r: (layers.index(r["layer"]), r["tokens"])):
            rows.append(f"| {r['layer']} [{r['k']} x {r['n']}] | {r['tokens']} | {r['bf16_us']:.1f} | "
                        f"{r['mma_us']:.1f} | {r['fused_us']:.1f} | {r['dequant_matmul_us']:.1f} | {record['gpu']} | "
                        f"`{path}` |")
    return rows if len(rows) > 2 else []


def profile_rows(root: str) -> list[str]:
    rows = []
    for path, r in load_records(root, "profile/*.json"):
        decode_ms = r["top_kernels_ms_per_step"].get("_decode_kernel", 0.0)
        line = (f"Decode profile (`{path}`, {r['gpu']}, {r['steps']} steps): "
                f"{r['wall_ms_per_step']:.2f} ms wall per step, {r['gpu_busy_ms_per_step']:.2f} ms GPU busy "
                f"(idle {100 * r['idle_fraction']:.1f}%"
                + (f", stalls of 20 us or more {100 * r['stall_fraction']:.1f}%" if "stall_fraction" in r else "")
                + f"), decode attention {decode_ms:.2f} ms")
        if r.get("bench_workload") and decode_ms:
            kv_dtype = r.get("kv_cache_dtype", "auto")
            kv_bytes = bench_kv_bytes(kv_dtype)
            line += f", i.e. {kv_bytes / (decode_ms * 1e-3 * r['steps']) / 1e12:.2f} TB/s of {kv_dtype} KV reads"
        rows.append(line + ".")
    return rows


def sampler_rows(root: str) -> list[str]:
    rows = []
    for path, r in load_records(root, "sampler/*.json"):
        cells = "; ".join(f"{n} rows {t['inverse_cdf']:.1f} us (noise per logit {t['gumbel']:.1f}, "
                          f"argmax {t['argmax']:.1f})" for n, t in r["kernel_us_per_call"].items())
        rows.append(f"Sampler, GPU time per call (`{path}`, {r['gpu']}, {r['vocab']:,} logits, "
                    f"T = {r['temperature']}): {cells}.")
    return rows


def sharegpt_rows(root: str) -> list[str]:
    rows = ["| conversations | config | tokens/s | TTFT mean / p99 (ms) | TPOT mean / p99 (ms) | KV capacity (tokens) "
            "| GPU | date | file |", "|---|---|---|---|---|---|---|---|---|"]
    for path, record in load_records(root, "sharegpt/*.json"):
        for r in record["configs"]:
            if "error" in r:
                rows.append(f"| {record['dataset']} | {r['config']} | failed: {r['error']} | | | | | | `{path}` |")
                continue
            rows.append(f"| {record['dataset']} | {r['config']} | {r['tokens_per_s']:,.0f} | "
                        f"{1e3 * r['ttft_mean_s']:.0f} / {1e3 * r['ttft_p99_s']:.0f} | "
                        f"{1e3 * r['tpot_mean_s']:.2f} / {1e3 * r['tpot_p99_s']:.2f} | {r['kv_capacity_tokens']:,} | "
                        f"{r['device']} | {record['date'][:10]} | `{path}` |")
    return rows if len(rows) > 2 else []


def quality_rows(root: str) -> list[str]:
    rows = ["| KV cache | model | device | greedy agreement | teacher-forced top-1 | mean KL | capacity x | file |",
            "|---|---|---|---|---|---|---|---|"]
    for path, r in load_records(root, "kv_int8_cache/quality-*.json"):
        rows.append(f"| {r['kv_cache_dtype']} | {r['model']} | {r['device']} | {r['greedy_token_agreement']:.3f} | "
                    f"{r['teacher_forced_top1_agreement']:.4f} | {r['teacher_forced_mean_kl']:.1e} | "
                    f"{r['kv_capacity_ratio']:.2f} | `{path}` |")
    return rows if len(rows) > 2 else []


def headline_rows(root: str) -> list[str]:
    """README's table: the newest throughput per GPU, workload and KV dtype."""
    rows = ["| GPU | workload | KV cache | tokens/s | x floor | date |", "|---|---|---|---|---|---|"]
    for gpu, records in sorted(latest_bench(root).items()):
        for (workload, kind), r in sorted(records.items(), key=lambda kv: (WORKLOAD_ORDER.index(kv[0][0]), kv[0][1])):
            ratio = r.get("seconds_over_floor")
            rows.append(f"| {gpu} | {workload} | {kind} | {r['tokens_per_s']:,.0f} | {ratio or '-'} | "
                        f"{r['date'][:10]} |")
    return rows


def replace_between_markers(path: str, table: str) -> None:
    with open(path) as f:
        text = f.read()
    if START not in text or END not in text:
        raise ValueError(f"{path} lacks the markers {START} and {END}")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    with open(path, "w") as f:
        f.write(f"{head}{START}\n{table}\n{END}{tail}")


def render(readme: str = "README.md", root: str = "benchmark_results") -> None:
    """README gets the headline table; root/README.md every table, each row naming its file."""
    parts = [bench_rows(root), profile_rows(root), sampler_rows(root), decode_attention_rows(root), quality_rows(root),
             awq_rows(root), awq_layer_rows(root), awq_batch_rows(root), sharegpt_rows(root)]
    full = os.path.join(root, "README.md")
    if not os.path.exists(full):
        with open(full, "w") as f:
            f.write(f"# Benchmark results\n\nRendered by `python -m nanovllm.tools.render_results` from the JSON "
                    f"files in this folder (machine, command and date inside each).\n\n{START}\n{END}\n")
    replace_between_markers(full, "\n\n".join("\n".join(rows) for rows in parts if rows))
    replace_between_markers(readme, "\n".join(headline_rows(root)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", default="README.md")
    parser.add_argument("--root", default="benchmark_results")
    parser.add_argument("--charts", action="store_true", help="also draw the PNG charts under ROOT/charts/ "
                        "(nanovllm/tools/charts.py; needs matplotlib)")
    args = parser.parse_args()
    if not os.path.isdir(args.root):
        parser.error(f"--root {args.root!r} is not a folder of benchmark records")
    render(args.readme, args.root)
    if args.charts:
        from nanovllm.tools.charts import render_charts
        for path in render_charts(args.root):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
