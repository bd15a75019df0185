"""AWQ against bf16 on the GPU, each in its own process: `python benchmarks/bench_awq_vs_bf16.py`.

Runs bench_one.py for Qwen3-0.6B and Qwen3-8B shapes, bf16 and AWQ, and writes
results/quantization_int_4/awq_vs_bf16.json (or --out) and a short report.md beside it with the ratios the
targets speak of (TPOT ratio at batch 1, throughput ratio at batch --num-seqs, weight memory ratio).
"""
import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timezone

from nanovllm.utils.results import results_path

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = results_path("quantization_int_4")   # untracked unless --out says otherwise


def measure(model: str, weights: str, num_seqs: int) -> dict:
    out = subprocess.run([sys.executable, os.path.join(HERE, "bench_one.py"), "--model", model, "--weights", weights,
                          "--num-seqs", str(num_seqs)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["Qwen3-0.6B", "Qwen3-8B"])
    parser.add_argument("--num-seqs", type=int, default=256, help="0: TPOT at batch 1 only")
    parser.add_argument("--out", default=os.path.join(OUT_DIR, "awq_vs_bf16.json"),
                        help="the JSON (README renders quantization_int_4/awq_vs_bf16*.json); the report goes beside "
                             "it, report.md for the default name")
    args = parser.parse_args()
    rows, lines = [], ["| model | weight memory AWQ/bf16 | TPOT batch 1 bf16 / AWQ (ms) | AWQ/bf16 TPOT | "
                       "throughput bf16 / AWQ (tok/s) | AWQ/bf16 throughput |", "|---|---|---|---|---|---|"]
    for model in args.models:
        bf16, awq = measure(model, "bf16", args.num_seqs), measure(model, "awq", args.num_seqs)
        row = {"model": model, "bf16": bf16, "awq": awq,
               "weight_memory_ratio": awq["linear_weight_bytes"] / bf16["linear_weight_bytes"],
               "tpot_ratio": awq["tpot_ms_batch1"] / bf16["tpot_ms_batch1"]}
        if bf16["throughput"]:
            row["throughput_ratio"] = awq["throughput"]["tokens_per_s"] / bf16["throughput"]["tokens_per_s"]
        rows.append(row)
        tp = (f"{bf16['throughput']['tokens_per_s']:.0f} / {awq['throughput']['tokens_per_s']:.0f} | "
              f"{row['throughput_ratio']:.3f}") if bf16["throughput"] else "- | -"
        lines.append(f"| {model} | {row['weight_memory_ratio']:.3f} | {bf16['tpot_ms_batch1']:.2f} / "
                     f"{awq['tpot_ms_batch1']:.2f} | {row['tpot_ratio']:.3f} | {tp} |")
        print(json.dumps(row))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    record = {"rows": rows, "command": "python " + " ".join(sys.argv),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    stem = os.path.splitext(os.path.basename(args.out))[0]
    report = os.path.join(os.path.dirname(args.out), "report.md" if stem == "awq_vs_bf16" else f"report-{stem}.md")
    with open(report, "w") as f:
        f.write(f"# AWQ vs bf16 ({rows[0]['bf16']['gpu']}, {record['date']})\n\n`{record['command']}`\n\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
