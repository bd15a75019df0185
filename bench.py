"""Throughput on a workload suite: `python bench.py [--workload NAME] [--engine nanovllm|hf] [options]`.

Workloads (prompt ids random in [0, 10000), random.seed(0), temperature 0.6, ignore_eos):
- random (default, nano-vllm's): 256 requests, prompt lengths and max_tokens each randint(100, 1024);
- short: 2,048 requests, prompts and outputs randint(16, 256): many more requests than seats, so newcomers
  are admitted while others decode (the normal case of an offline batch);
- long: 64 requests, prompts randint(8k, 16k), outputs randint(200, 500);
- prefix: 512 requests sharing one 4,000-token prefix plus randint(20, 100) own tokens, 128 outputs;
- sharegpt: the shipped ShareGPT-format sample (bench_sharegpt.py's reading of it), its reply lengths.
One warm-up generate (its second step an eager mixed one); the timed run counts prefill and decode;
throughput = output tokens / seconds.
`--repeat N` times N runs on the same engine (prefix cache reset between them) and reports the median
(of an even count, the faster of the two middle runs; every run's step times in `runs_step_stats`).
Engine settings are the Config defaults unless given (--max-num-seqs, --max-num-batched-tokens); the
model length is the workload's longest request.

Every run prints the workload's physical floor on this GPU: the bytes it must read (each decode token
reads its sequence's context; a prefix shared in the cache counted once per step; the weights once per
step, at least max(longest output, output tokens / max_num_seqs) steps) at the copy rate, and its FLOPs
(2 x parameters per computed token, attention's causal score and value products) at the matmul rate,
both rates measured on this device after the run; floor = the larger of the two; `seconds_over_floor` is the
ratio. Without a local checkpoint the shipped Qwen3-0.6B config runs with random weights
(load_format="dummy"), and the output says so. `--profile` adds a profiled pass over 150 steps and reports
the GPU's idle fraction between kernels and the kernels that take most time, for the 150 steps and for
their admission phase alone (the prefill and mixed steps while requests wait). JSON per workload under
results/bench/ (untracked) or --out.
"""
import argparse
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import torch

from nanovllm.config import load_hf_config
from nanovllm.configs import shipped_config_dir, shipped_config_names
from nanovllm.models.decoder import head_dim_of, is_sparse_layer
from nanovllm.utils.results import results_path, save_record

DEFAULT_MODEL = "~/huggingface/Qwen3-0.6B/"
WORKLOADS = ("random", "short", "long", "prefix", "sharegpt")


@dataclass
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]
    shared_prefix: int = 0     # leading tokens every prompt shares


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(0, 10000) for _ in range(n)]


def workload(num_seqs: int, max_input_len: int, max_output_len: int):
    """The random workload: (prompts, max_tokens)."""
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, max_input_len))]
               for _ in range(num_seqs)]
    max_tokens = [random.randint(100, max_output_len) for _ in range(num_seqs)]
    return prompts, max_tokens


def make_workload(name: str, args) -> Workload:
    rng = random.Random(0)
    if name == "random":
        return Workload(*workload(args.num_seqs, args.max_input_len, args.max_output_len))
    if name == "short":
        return Workload([_ids(rng, rng.randint(16, 256)) for _ in range(2048)],
                        [rng.randint(16, 256) for _ in range(2048)])
    if name == "long":
        return Workload([_ids(rng, rng.randint(8000, 16000)) for _ in range(64)],
                        [rng.randint(200, 500) for _ in range(64)])
    if name == "prefix":
        prefix = _ids(rng, 4000)
        return Workload([prefix + _ids(rng, rng.randint(20, 100)) for _ in range(512)], [128] * 512,
                        shared_prefix=4000)
    if name == "sharegpt":
        from bench_sharegpt import SAMPLE, load_requests
        from nanovllm.demo.byte_tokenizer import build_byte_tokenizer
        tok = build_byte_tokenizer()
        requests = load_requests(SAMPLE, lambda text: [t % 10000 for t in tok.encode(text)], 10**9, 0, 4096)
        return Workload([p for p, _ in requests], [n for _, n in requests])
    raise ValueError(f"unknown workload {name!r}; choose one of {list(WORKLOADS)}")


def measured_rates(device: str) -> tuple[float, float]:
    """(copy bytes/s, matmul FLOP/s) of this device (bf16 on a GPU, float32 on CPU): the best of 5 runs."""
    cuda = device == "cuda"
    size, n, dtype = (2**30, 8192, torch.bfloat16) if cuda else (2**26, 1024, torch.float32)
    x = torch.empty(size, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    a = torch.randn(n, n, dtype=dtype, device=device)

    def best_seconds(fn) -> float:
        times = []
        for _ in range(6):
            torch.cuda.synchronize() if cuda else None
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize() if cuda else None
            times.append(time.perf_counter() - start)
        return min(times[1:])     # the first run warms up

    return 2 * size / best_seconds(lambda: y.copy_(x)), 2 * n**3 / best_seconds(lambda: a @ a)


def active_params(cfg) -> int:
    """Weights one token reads: attention and MLP of every layer (a sparse MoE layer's router and its top_k
    experts only) and the LM head."""
    hidden, experts = cfg.hidden_size, getattr(cfg, "num_experts", 0) or 0
    total = hidden * cfg.vocab_size
    for i in range(cfg.num_hidden_layers):
        total += hidden * head_dim_of(cfg) * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
        total += (hidden * experts + 3 * hidden * cfg.moe_intermediate_size * cfg.num_experts_per_tok
                  if experts and is_sparse_layer(cfg, i) else 3 * hidden * cfg.intermediate_size)
    return total


def physical_floor(model_dir: str, w: Workload, kv_cache_dtype: str, max_num_seqs: int, prefix_caching: bool,
                   rates: tuple[float, float]) -> dict:
    """Seconds this workload needs at least on this GPU (see the module docstring), and its parts."""
    cfg = load_hf_config(model_dir)
    head_dim = head_dim_of(cfg)
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads
    value_bytes = 2 if kv_cache_dtype == "auto" else 1 + 4 / head_dim      # 1-byte values + a float32 scale
    kv_per_token = 2 * layers * cfg.num_key_value_heads * head_dim * value_bytes
    params = active_params(cfg)        # a step's weights (an MoE step at full batch reads more experts)
    outputs = sum(w.max_tokens)
    steps = max(max(w.max_tokens), math.ceil(outputs / max_num_seqs))
    shared = w.shared_prefix if prefix_caching else 0
    # decode token j (j = 1..n-1) of a prompt of length p attends to p + j keys
    keys = sum(len(p) * (n - 1) + (n - 1) * n / 2 for p, n in zip(w.prompts, w.max_tokens))
    kv_tokens = keys - shared * (outputs - len(w.prompts)) + shared * steps   # a cached prefix read once a step
    computed = sum(len(p) - shared for p in w.prompts) + shared + outputs
    # causal prompt attention; a cached prefix's own attention is computed once
    prompt_keys = sum((len(p) - shared) * shared + (len(p) - shared) ** 2 / 2 for p in w.prompts) + shared ** 2 / 2
    attn_flops = 4 * layers * heads * head_dim * (prompt_keys + keys)
    flops = 2 * params * computed + attn_flops
    bytes_read = kv_tokens * kv_per_token + steps * params * 2
    copy_rate, mm_rate = rates
    memory_s, compute_s = bytes_read / copy_rate, flops / mm_rate
    return {"floor_s": round(max(memory_s, compute_s), 3), "memory_s": round(memory_s, 3),
            "compute_s": round(compute_s, 3), "kv_bytes": kv_tokens * kv_per_token, "flops": flops,
            "copy_bytes_per_s": round(copy_rate), "matmul_flop_per_s": round(mm_rate), "min_steps": steps}


def resolve_model(path: str) -> tuple[str, str]:
    """(model dir, load_format): a checkpoint as it is; a folder with only config.json, or a shipped
    config's name, with random weights ("dummy"); anything else falls back to the shipped Qwen3-0.6B."""
    expanded = os.path.expanduser(path)
    if os.path.exists(os.path.join(expanded, "config.json")):
        weights = any(f.endswith(".safetensors") for f in os.listdir(expanded))
        return expanded, "auto" if weights else "dummy"
    name = os.path.basename(os.path.normpath(expanded))
    name = name if name in shipped_config_names() else "Qwen3-0.6B"
    print(f"# {path} has no checkpoint: using the shipped {name} config with random weights "
          f"(load_format='dummy')", file=sys.stderr)
    return shipped_config_dir(name), "dummy"


def run_nanovllm(args, model, load_format, w: Workload) -> dict:
    from nanovllm import LLM, SamplingParams
    from nanovllm.engine.cuda_graph import MIXED_MAX_TOKENS
    started = time.perf_counter()
    settings = {k: v for k, v in (("max_num_seqs", args.max_num_seqs),
                                  ("max_num_batched_tokens", args.max_num_batched_tokens),
                                  ("kvcache_block_size", args.kvcache_block_size)) if v is not None}
    llm = LLM(model, load_format=load_format, enforce_eager=args.enforce_eager, max_model_len=args.max_model_len,
              kv_cache_dtype=args.kv_cache_dtype, tensor_parallel_size=args.tensor_parallel_size,
              attention_backend=args.attention_backend, enable_prefix_caching=not args.no_prefix_caching,
              enable_cascade_attention=args.enable_cascade_attention, **settings)
    startup_s = time.perf_counter() - started
    llm.scheduler.admit_min_free_seats = max(1, int(args.admission_wave * llm.config.max_num_seqs))
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in w.max_tokens]
    # warm-up on a slice of the workload itself, so kernel compilation stays out of the timed run: prompts
    # until they overflow one step's budget by more than a graph's tokens, so that the second step is an
    # eager mixed step (decode rows and a long prefill chunk), the path of a large batch's first steps
    warm, tokens = [], 0
    for prompt in w.prompts:
        warm.append(prompt)
        tokens += len(prompt)
        if len(warm) >= 8 and tokens > llm.config.max_num_batched_tokens + MIXED_MAX_TOKENS:
            break
    llm.generate(warm, [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=8)] * len(warm), use_tqdm=False)
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    runs = []
    for _ in range(args.repeat):     # the same engine, the same workload: run-to-run spread without restarts
        llm.stats = dict.fromkeys(llm.stats, 0)
        if not llm.reset_prefix_cache():   # a repeat must not find its prompts cached
            raise RuntimeError("the prefix cache could not be reset: requests still hold blocks")
        start = time.perf_counter()
        outs = llm.generate(w.prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        assert all(len(o["token_ids"]) == n for o, n in zip(outs, w.max_tokens)), "a sequence stopped early"
        runs.append({"seconds": seconds, "output_tokens": sum(len(o["token_ids"]) for o in outs),
                     "step_stats": {k: round(v, 3) for k, v in llm.stats.items()}})
    median = sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]   # the faster middle run of an even count
    result = {**median, "runs_seconds": [round(r["seconds"], 3) for r in runs],
              "runs_step_stats": [r["step_stats"] for r in runs], "startup_s": round(startup_s, 1),
              "kv_cache_tokens": llm.model_runner.num_kvcache_blocks * llm.config.kvcache_block_size,
              "preemptions": llm.scheduler.num_preemptions,
              "engine_settings": {"max_num_seqs": llm.config.max_num_seqs,
                                  "max_num_batched_tokens": llm.config.max_num_batched_tokens,
                                  "enable_prefix_caching": llm.config.enable_prefix_caching}}
    if args.profile:
        from nanovllm.tools.decode_profile import profile_steps
        llm.reset_prefix_cache()
        for prompt, p in zip(w.prompts, params):
            llm.add_request(prompt, p)
        result["profile"] = profile_steps(llm, steps=150)
        while not llm.scheduler.is_finished():
            llm.step()
        llm._drain()
    return result


def run_hf(args, model, load_format, w: Workload) -> dict:
    """Transformers' continuous batching manager, one request per prompt with its own max_new_tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    config = AutoConfig.from_pretrained(model)
    if load_format == "dummy":
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    else:
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
    hf = hf.cuda().eval()
    prompts, max_tokens = w.prompts, w.max_tokens
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
    parser.add_argument("--workload", choices=WORKLOADS, default="random")
    parser.add_argument("--engine", choices=["nanovllm", "hf"], default="nanovllm")
    parser.add_argument("--num-seqs", type=int, default=256, help="random workload: requests")
    parser.add_argument("--max-input-len", type=int, default=1024, help="random workload")
    parser.add_argument("--max-output-len", type=int, default=1024, help="random workload")
    parser.add_argument("--max-model-len", type=int, default=None, help="default: the longest request, at least 4096")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: Config's")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: Config's")
    parser.add_argument("--kvcache-block-size", type=int, default=None,
                        help="default: Config's (256); prefix caching shares whole blocks only")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--enable-cascade-attention", action=argparse.BooleanOptionalAction, default=True,
                        help="decode reads a prefix shared through the cache once per step for its sharers")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--admission-wave", type=float, default=0.0, metavar="FRACTION",
                        help="admit waiting requests only once this fraction of the seats is free (admission in "
                             "waves); 0, the engine's way, admits them in any step with a free seat")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="timed runs (nanovllm); the median is reported")
    parser.add_argument("--profile", action="store_true", help="also report the GPU idle fraction (150 steps)")
    parser.add_argument("--out", default=None,
                        help="JSON file (default: results/bench/<engine>-<model>-<workload>-...json, untracked; "
                             "the README's table renders benchmark_results/bench/)")
    args = parser.parse_args()
    if not 0 <= args.admission_wave <= 1:
        parser.error(f"--admission-wave is a fraction of the seats, from 0 to 1; got {args.admission_wave}")
    if args.workload == "random" and min(args.max_input_len, args.max_output_len) < 100:
        parser.error("the random workload draws lengths from randint(100, max): --max-input-len and "
                     "--max-output-len must be >= 100")

    model, load_format = resolve_model(args.model)
    w = make_workload(args.workload, args)
    vocab = load_hf_config(model).vocab_size
    if vocab <= 10000:      # a small model (tests): the workload's ids folded into its vocabulary
        w.prompts = [[t % vocab for t in p] for p in w.prompts]
    longest = max(len(p) + n for p, n in zip(w.prompts, w.max_tokens))
    args.max_model_len = args.max_model_len or max(4096, longest)
    run = run_nanovllm if args.engine == "nanovllm" else run_hf
    result = run(args, model, load_format, w)
    cuda = torch.cuda.is_available()
    from nanovllm.config import Config
    defaults = {f.name: f.default for f in Config.__dataclass_fields__.values()}
    seats = result.get("engine_settings", {}).get("max_num_seqs") or args.max_num_seqs or defaults["max_num_seqs"]
    floor = physical_floor(model, w, args.kv_cache_dtype, seats, not args.no_prefix_caching,
                           measured_rates("cuda" if cuda else "cpu"))
    record = {
        "engine": args.engine, "workload": args.workload, "gpu": torch.cuda.get_device_name() if cuda else "cpu",
        "model": os.path.basename(os.path.normpath(model)), "load_format": load_format,
        "num_requests": len(w.prompts), "prompt_tokens": sum(map(len, w.prompts)), **result,
        "tokens_per_s": round(result["output_tokens"] / result["seconds"], 1),
        "floor": floor, "seconds_over_floor": round(result["seconds"] / floor["floor_s"], 2),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "model", "engine")},
        "command": "python " + " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    workload_tag = "" if args.workload == "random" else f"-{args.workload}"
    save_record(record, args.out or results_path(
        "bench", f"{args.engine}-{record['model']}{workload_tag}-{args.kv_cache_dtype}"
        f"{'-eager' if args.enforce_eager else ''}-tp{args.tensor_parallel_size}.json"))


if __name__ == "__main__":
    main()
