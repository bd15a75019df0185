"""Compare configurations on conversation data: `python bench_sharegpt.py [--model DIR] [--dataset FILE]`.

Reads ShareGPT-format JSON ([{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}]):
the first human turn is the prompt and the reply's token count is the output length (vLLM's benchmark
convention; ignore_eos so every request produces it). By default it reads the small sample made for this
repository (benchmarks/data/sharegpt_format_sample.json, NOT the real ShareGPT data: pass that with
--dataset). The AWQ configuration uses --awq-model, or random AWQ weights for a dummy model, or quantizes
the model first (python -m nanovllm.quant.awq_quantize). Each configuration (bf16 / int8 / fp8 KV cache,
AWQ weights; `--configs spec`: bf16 with n-gram speculative decoding, for trained weights) runs in its own
process and reports throughput, TTFT and TPOT (mean and p99), KV capacity in tokens and peak memory. Writes
JSON (and a PNG chart when matplotlib is installed) under benchmark_results/sharegpt/.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmarks", "data", "sharegpt_format_sample.json")
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
CONFIGS = {"bf16": {}, "int8": {"kv_cache_dtype": "int8"}, "fp8": {"kv_cache_dtype": "fp8"}, "awq": {"awq": True},
           "spec": {"speculative_config": NGRAM}}


def load_requests(path: str, tokenizer, num_prompts: int, seed: int, max_model_len: int):
    """[(prompt ids, output length)] drawn at random from the conversations that have a reply."""
    with open(path) as f:
        data = json.load(f)
    pairs = []
    for item in data:
        turns = item.get("conversations", [])
        if len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt":
            pairs.append((turns[0]["value"], turns[1]["value"]))
    random.Random(seed).shuffle(pairs)
    requests = []
    for prompt, reply in pairs:
        prompt_ids, out_len = tokenizer(prompt), len(tokenizer(reply))
        if 0 < len(prompt_ids) and out_len > 0 and len(prompt_ids) + out_len < max_model_len:
            requests.append((prompt_ids, out_len))
        if len(requests) == num_prompts:
            break
    return requests


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def run_one(args) -> dict:
    import torch

    from nanovllm import LLM, SamplingParams
    from nanovllm.configs import with_awq_config
    from nanovllm.demo.byte_tokenizer import build_byte_tokenizer
    from nanovllm.quant.awq_quantize import quantize_checkpoint
    settings = dict(CONFIGS[args.run_one])
    model = args.model
    if settings.pop("awq", False):     # an AWQ checkpoint given, random AWQ weights, or one quantized now
        model = args.awq_model or (with_awq_config(model) if args.load_format == "dummy" else
                                   quantize_checkpoint(model, tempfile.mkdtemp(prefix="awq-")))
    llm = LLM(model, load_format=args.load_format, max_model_len=args.max_model_len, **settings)
    tok = llm.tokenizer or build_byte_tokenizer()      # a bare config has no tokenizer: count bytes instead
    vocab = llm.config.hf_config.vocab_size
    requests = load_requests(args.dataset, lambda text: [t % vocab for t in tok.encode(text)], args.num_prompts,
                             args.seed, args.max_model_len)
    if not requests:
        raise ValueError(f"no conversation in {args.dataset} fits --max-model-len {args.max_model_len} "
                         "(its prompt and reply tokens together): raise it")
    params = [SamplingParams(temperature=0, ignore_eos=True, max_tokens=n) for _, n in requests]
    llm.generate([p for p, _ in requests[:4]], [SamplingParams(max_tokens=4)] * min(4, len(requests)),
                 use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in requests], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    ttft = [o["metrics"]["first_token_time"] - o["metrics"]["arrival_time"] for o in outs]
    tpot = [(o["metrics"]["finish_time"] - o["metrics"]["first_token_time"]) / (len(o["token_ids"]) - 1)
            for o in outs if len(o["token_ids"]) > 1]
    cuda = torch.cuda.is_available()
    drafts = [(o["metrics"].get("num_draft_tokens", 0), o["metrics"].get("num_accepted_tokens", 0)) for o in outs]
    spec = {"draft_tokens": sum(d for d, _ in drafts), "accepted_tokens": sum(a for _, a in drafts)} \
        if "speculative_config" in settings else {}
    return spec | {"config": args.run_one, "num_requests": len(requests), "seconds": seconds,
            "output_tokens": sum(len(o["token_ids"]) for o in outs),
            "tokens_per_s": sum(len(o["token_ids"]) for o in outs) / seconds,
            "ttft_mean_s": sum(ttft) / len(ttft), "ttft_p99_s": percentile(ttft, 99),
            "tpot_mean_s": sum(tpot) / max(len(tpot), 1), "tpot_p99_s": percentile(tpot, 99) if tpot else 0.0,
            "kv_capacity_tokens": llm.model_runner.num_kvcache_blocks * llm.config.kvcache_block_size,
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else peak_rss_bytes(),
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "tokenizer": "model" if llm.tokenizer else "byte-level fallback"}


def peak_rss_bytes() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def chart(records: list[dict], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is not installed: no chart", file=sys.stderr)
        return
    names = [r["config"] for r in records]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, key, label in zip(axes, ("tokens_per_s", "tpot_mean_s", "kv_capacity_tokens"),
                              ("output tokens/s", "mean TPOT (s)", "KV capacity (tokens)")):
        ax.bar(names, [r[key] for r in records])
        ax.set_title(label)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    from nanovllm.configs import shipped_config_dir
    from nanovllm.utils.results import results_path
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint dir (default: shipped Qwen3-0.6B, dummy)")
    parser.add_argument("--load-format", default=None)
    parser.add_argument("--dataset", default=SAMPLE)
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--awq-model", default=None, help="an AWQ checkpoint for the 'awq' configuration")
    parser.add_argument("--configs", nargs="+", default=[c for c in CONFIGS if c != "spec"], choices=list(CONFIGS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--run-one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.num_prompts < 1 or args.max_model_len < 16:
        parser.error(f"--num-prompts must be >= 1 and --max-model-len >= 16, got {args.num_prompts} and "
                     f"{args.max_model_len}")
    if not os.path.isfile(args.dataset):
        parser.error(f"--dataset {args.dataset!r} is not a file (a ShareGPT-format JSON list)")
    if args.model is None:
        args.model, args.load_format = shipped_config_dir("Qwen3-0.6B"), args.load_format or "dummy"
    args.load_format = args.load_format or "auto"
    if args.run_one:
        print(json.dumps(run_one(args)))
        return
    records = []
    for name in args.configs:
        cmd = [sys.executable, __file__, "--run-one", name, "--model", args.model, "--load-format", args.load_format,
               "--dataset", args.dataset, "--num-prompts", str(args.num_prompts), "--seed", str(args.seed),
               "--max-model-len", str(args.max_model_len)] + (["--awq-model", args.awq_model] if args.awq_model else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(f"# {name} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
            records.append({"config": name, "error": out.stderr.strip().splitlines()[-1]})
            continue
        records.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(records[-1]))
    result = {"model": os.path.basename(os.path.normpath(args.model)), "load_format": args.load_format,
              "dataset": os.path.basename(args.dataset), "configs": records, "command": "python " + " ".join(sys.argv),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    out = args.out or results_path("sharegpt", f"{result['model']}-{result['dataset']}.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    chart([r for r in records if "error" not in r], out.replace(".json", ".png"))
    if any("error" in r for r in records):
        sys.exit(1)


if __name__ == "__main__":
    main()
