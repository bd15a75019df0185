"""Throughput on nano-vllm's random-token workload: `python bench.py [--engine nanovllm|hf] [options]`.

256 sequences (random.seed(0)), prompt ids randint(0, 10000), prompt lengths and max_tokens each
randint(100, 1024), temperature 0.6, ignore_eos; one warm-up generate; the timed run counts prefill and
decode; throughput = output tokens / seconds. `--repeat N` times N runs on the same engine and reports the
median run (all N times are in `runs_seconds`). Without a local checkpoint the shipped Qwen3-0.6B config
runs with random weights (load_format="dummy"), and the output says so.
"""
import argparse
import os
import random
import sys
import time
from datetime import datetime, timezone

import torch

from nanovllm.configs import shipped_config_dir
from nanovllm.utils.results import save_record

DEFAULT_MODEL = "~/huggingface/Qwen3-0.6B/"
HBM_BYTES_PER_S = 4.3e12     # H200 device-to-device copy rate measured on the device machine


def kv_read_bytes(model_dir: str, prompts: list[list[int]], max_tokens: list[int], kv_cache_dtype: str) -> float:
    """Bytes of K/V every decode step must read, summed over the run: each step reads each running
    sequence's whole context once (the decode floor, before weights)."""
    from nanovllm.config import load_hf_config
    cfg = load_hf_config(model_dir)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    value_bytes = 2 if kv_cache_dtype == "auto" else 1 + 4 / head_dim      # 1-byte values + a float32 scale
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * value_bytes
    return per_token * sum(len(p) * (n - 1) + (n - 1) * n / 2 for p, n in zip(prompts, max_tokens))


def workload(num_seqs: int, max_input_len: int, max_output_len: int):
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, max_input_len))]
               for _ in range(num_seqs)]
    max_tokens = [random.randint(100, max_output_len) for _ in range(num_seqs)]
    return prompts, max_tokens


def resolve_model(path: str) -> tuple[str, str]:
    """(model dir, load_format): a shipped config with dummy weights when `path` has no checkpoint."""
    expanded = os.path.expanduser(path)
    if os.path.exists(os.path.join(expanded, "config.json")) and any(
            f.endswith(".safetensors") for f in os.listdir(expanded)):
        return expanded, "auto"
    name = os.path.basename(os.path.normpath(expanded))
    name = name if name in ("Qwen3-0.6B", "Qwen3-8B") else "Qwen3-0.6B"
    print(f"# {path} has no checkpoint: using the shipped {name} config with random weights "
          f"(load_format='dummy')", file=sys.stderr)
    return shipped_config_dir(name), "dummy"


def run_nanovllm(args, model, load_format, prompts, max_tokens) -> dict:
    from nanovllm import LLM, SamplingParams
    llm = LLM(model, load_format=load_format, enforce_eager=args.enforce_eager, max_model_len=args.max_model_len,
              kv_cache_dtype=args.kv_cache_dtype, tensor_parallel_size=args.tensor_parallel_size,
              max_num_seqs=max(args.num_seqs, 1), attention_backend=args.attention_backend)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in max_tokens]
    # warm-up on a slice of the workload itself, so kernel compilation stays out of the timed run
    warm = prompts[:8]
    llm.generate(warm, [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=8)] * len(warm), use_tqdm=False)
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    runs = []
    for _ in range(args.repeat):     # the same engine, the same workload: run-to-run spread without restarts
        llm.stats = dict.fromkeys(llm.stats, 0)
        if not llm.reset_prefix_cache():   # a repeat must not find its prompts cached
            raise RuntimeError("the prefix cache could not be reset: requests still hold blocks")
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        assert all(len(o["token_ids"]) == n for o, n in zip(outs, max_tokens)), "a sequence stopped early"
        runs.append({"seconds": seconds, "output_tokens": sum(len(o["token_ids"]) for o in outs),
                     "step_stats": {k: round(v, 3) for k, v in llm.stats.items()}})
    median = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    return {**median, "runs_seconds": [round(r["seconds"], 3) for r in runs],
            "kv_cache_tokens": llm.model_runner.num_kvcache_blocks * llm.config.kvcache_block_size,
            "preemptions": llm.scheduler.num_preemptions}


def run_hf(args, model, load_format, prompts, max_tokens) -> dict:
    """Transformers' continuous batching manager, one request per prompt with its own max_new_tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    config = AutoConfig.from_pretrained(model)
    if load_format == "dummy":
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    else:
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
    hf = hf.cuda().eval()
    gen = GenerationConfig(do_sample=True, temperature=0.6, top_k=0, top_p=1.0, max_new_tokens=max(max_tokens),
                           eos_token_id=-1, pad_token_id=0)

    def generate(batch, lengths) -> int:
        manager = hf.init_continuous_batching(generation_config=gen)
        manager.start()
        ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(batch, lengths)]
        done, total = set(), 0
        while len(done) < len(ids):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished() and result.request_id not in done:
                done.add(result.request_id)
                total += len(result.generated_tokens)
        manager.stop(block=True)
        return total

    generate(prompts[:2], [8, 8])
    torch.cuda.synchronize()
    start = time.perf_counter()
    total = generate(prompts, max_tokens)
    return {"seconds": time.perf_counter() - start, "output_tokens": total}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--engine", choices=["nanovllm", "hf"], default="nanovllm")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--max-input-len", type=int, default=1024)
    parser.add_argument("--max-output-len", type=int, default=1024)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="timed runs (nanovllm); the median is reported")
    parser.add_argument("--out", default=None, help="JSON file (default: benchmark_results/bench/<engine>-...json)")
    args = parser.parse_args()

    model, load_format = resolve_model(args.model)
    prompts, max_tokens = workload(args.num_seqs, args.max_input_len, args.max_output_len)
    run = run_nanovllm if args.engine == "nanovllm" else run_hf
    result = run(args, model, load_format, prompts, max_tokens)
    floor_s = kv_read_bytes(model, prompts, max_tokens, args.kv_cache_dtype) / HBM_BYTES_PER_S
    record = {
        "engine": args.engine, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "model": os.path.basename(os.path.normpath(model)), "load_format": load_format,
        "num_seqs": args.num_seqs, "prompt_tokens": sum(map(len, prompts)), **result,
        "tokens_per_s": round(result["output_tokens"] / result["seconds"], 1),
        "kv_read_floor_s": round(floor_s, 3), "seconds_over_kv_floor": round(result["seconds"] / floor_s, 2),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "model", "engine")},
        "command": "python " + " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    save_record(record, args.out or os.path.join(
        "benchmark_results", "bench", f"{args.engine}-{record['model']}-{args.kv_cache_dtype}"
        f"{'-eager' if args.enforce_eager else ''}-tp{args.tensor_parallel_size}.json"))


if __name__ == "__main__":
    main()
