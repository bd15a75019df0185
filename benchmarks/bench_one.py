"""One AWQ-or-bf16 measurement on the GPU: `python benchmarks/bench_one.py --model Qwen3-8B --weights awq`.

Random weights from a shipped config (load_format="dummy"); "awq" adds an AutoAWQ quantization_config
(group 128, GEMM) to a copy of the config. Measures linear-layer weight memory, decode TPOT at batch 1
(256 tokens after a 128-token prompt) against its floor (bf16: the weights one token reads, an MoE layer's
top_k experts only, at bench.py's measured copy rate), and bench.py-style throughput (--num-seqs requests).
Prints JSON.
"""
import argparse
import os
import random
import sys
import time
from datetime import datetime, timezone

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository root
from bench import active_params, measured_rates, workload  # noqa: E402
from nanovllm import LLM, SamplingParams  # noqa: E402
from nanovllm.configs import shipped_config_dir, with_awq_config  # noqa: E402
from nanovllm.utils.results import results_path, save_record  # noqa: E402


def linear_weight_bytes(llm: LLM) -> int:
    total = 0
    for name, p in llm.model_runner.model.named_parameters():
        if any(k in name for k in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
            total += p.numel() * p.element_size()
    return total


def tpot_batch1(llm: LLM, steps: int = 256) -> float:
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=steps)
    prompt = [random.randint(0, 10000) for _ in range(128)]
    llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    llm.stats = dict.fromkeys(llm.stats, 0)
    llm.generate([prompt], params, use_tqdm=False)
    return 1e3 * llm.stats["decode_s"] / llm.stats["decode_steps"]


def throughput(llm: LLM, num_seqs: int) -> dict:
    prompts, max_tokens = workload(num_seqs, 1024, 1024)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in max_tokens]
    llm.generate(prompts[:8], [SamplingParams(max_tokens=8, ignore_eos=True)] * 8, use_tqdm=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o["token_ids"]) for o in outs)
    return {"num_seqs": num_seqs, "seconds": seconds, "output_tokens": tokens, "tokens_per_s": tokens / seconds,
            "prefill_s": llm.stats["prefill_s"], "decode_s": llm.stats["decode_s"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="Qwen3-0.6B")
    parser.add_argument("--weights", choices=["bf16", "awq"], default="awq")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--out", default=None, help="JSON file (default: results/bench_one/<model>-<weights>.json)")
    args = parser.parse_args()
    random.seed(0)
    path = shipped_config_dir(args.model)
    path = with_awq_config(path) if args.weights == "awq" else path
    copy_rate = measured_rates("cuda")[0] if args.weights == "bf16" else None   # before the engine takes memory
    llm = LLM(path, load_format="dummy", dtype="bfloat16", max_model_len=4096, max_num_seqs=max(args.num_seqs, 1))
    tpot = tpot_batch1(llm)
    floor = {}
    if args.weights == "bf16":
        floor_ms = 1e3 * 2 * active_params(llm.config.hf_config) / copy_rate
        floor = {"copy_bytes_per_s": round(copy_rate), "tpot_floor_ms": floor_ms, "tpot_over_floor": tpot / floor_ms}
    record = {"model": args.model, "weights": args.weights, "gpu": torch.cuda.get_device_name(),
              "linear_weight_bytes": linear_weight_bytes(llm), "tpot_ms_batch1": tpot, **floor,
              "throughput": throughput(llm, args.num_seqs) if args.num_seqs else None,
              "command": "python " + " ".join(sys.argv),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    save_record(record, args.out or results_path("bench_one", f"{args.model}-{args.weights}.json"))


if __name__ == "__main__":
    main()
