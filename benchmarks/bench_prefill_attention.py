"""Prefill-attention microbenchmark: the steps the long and short workloads run, per launch setting.

    python benchmarks/bench_prefill_attention.py [--model Qwen3-0.6B] [--kv-cache-dtype auto int8]
        [--settings 64/64/4/2 ...] [--out FILE]

--model's attention shape (a shipped config; Qwen3-0.6B: 16 query heads, 8 KV heads, head_dim 128), one
layer, 256-token blocks scattered over the pool. Steps (query lengths over context lengths):
- "12k+4.4k fresh": a 16k-token step of two prompts from their first token (the long workload's first step);
- "16k after 8k": a 16k chunk of a prompt whose first 8k keys are cached (a later chunk);
- "64 x 250": bench-like short prompts;
- "32 decodes x 12k + 16k chunk": an eager mixed step of the long workload, through the Triton backend
  (decode rows by the decode kernel) and, as "...in one launch", through the prefill kernel alone.
FLOPs counted = 4 x heads x head_dim x (visible keys per query), i.e. the causal score and value products.
Settings are block_m/block_n/num_warps/num_stages; "default" is prefill_settings'. Prints one JSON line
per (dtype, step, setting) and writes all of them to --out (default results/prefill-attention.json).
"""
import argparse
import dataclasses
import json
import sys
from datetime import datetime, timezone

import torch
from triton.testing import do_bench

from nanovllm.attention.metadata import AttentionMetadata, decode_order
from nanovllm.attention.triton_backend import TritonBackend
from nanovllm.attention.triton_decode import num_decode_splits
from nanovllm.attention.triton_prefill import prefill_attention
from nanovllm.config import load_hf_config
from nanovllm.configs import shipped_config_dir
from nanovllm.models.decoder import head_dim_of
from nanovllm.quant.kv import LayerKVCache, quantize_ref, quantized_cache
from nanovllm.utils.results import results_path, save_record

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 256     # Qwen3-0.6B's; --model sets them
STEPS = {"12k+4.4k fresh": ([12000, 4384], [12000, 4384]),
         "16k after 8k": ([16384], [24576]),
         "64 x 250": ([250] * 64, [250] * 64),
         "32 decodes x 12k + 16k chunk": ([1] * 32 + [16352], [12000] * 32 + [16352])}


def set_model_shape(name: str) -> None:
    global HEADS, KV_HEADS, HEAD_DIM
    cfg = load_hf_config(shipped_config_dir(name))
    HEADS, KV_HEADS, HEAD_DIM = cfg.num_attention_heads, cfg.num_key_value_heads, head_dim_of(cfg)


def make_step(query_lens, context_lens, kind: str):
    """(q, cache, metadata) of one step, blocks at random over the pool."""
    blocks = [-(-c // BLOCK) for c in context_lens]
    pool = torch.randperm(sum(blocks), device="cuda").int()
    tables = torch.full((len(blocks), max(blocks)), -1, dtype=torch.int32, device="cuda")
    start = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = pool[start:start + n]
        start += n
    shape = (sum(blocks), BLOCK, KV_HEADS, HEAD_DIM)
    k, v = (torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    if kind == "auto":
        cache = LayerKVCache(k, v)
    else:
        (kq, ks), (vq, vs) = quantize_ref(k, kind), quantize_ref(v, kind)
        cache = quantized_cache(kq, vq, ks, vs)
    q = torch.randn(sum(query_lens), HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    num_decodes = sum(1 for n in query_lens if n == 1) if len(set(query_lens)) > 1 else 0
    decodes = context_lens[:num_decodes]
    meta = AttentionMetadata(
        is_prefill=True, slot_mapping=torch.empty(0, dtype=torch.int64, device="cuda"),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device="cuda"), block_tables=tables,
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device="cuda"), max_seqlen_q=max(query_lens),
        max_seqlen_k=max(context_lens), context_lens_cpu=list(context_lens), cu_seqlens_q_cpu=cu,
        num_decodes=num_decodes,
        num_decode_splits=num_decode_splits(len(decodes), KV_HEADS, max(decodes)) if decodes else 1,
        decode_order=torch.from_numpy(decode_order(decodes)).cuda() if decodes else None)
    return q, cache, meta


def flops(query_lens, context_lens) -> float:
    keys = sum(n * (c - n) + n * (n + 1) / 2 for n, c in zip(query_lens, context_lens))
    return 4 * HEADS * HEAD_DIM * keys


def parse_settings(text: str) -> dict | None:
    if text == "default":
        return None
    block_m, block_n, num_warps, num_stages = map(int, text.split("/"))
    return {"block_m": block_m, "block_n": block_n, "num_warps": num_warps, "num_stages": num_stages}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen3-0.6B", help="a shipped config: the attention shape")
    parser.add_argument("--kv-cache-dtype", nargs="+", default=["auto", "int8"])
    parser.add_argument("--settings", nargs="+", default=["default"])
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--out", default=results_path("prefill-attention.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("this benchmark times GPU kernels: it needs a CUDA device")
    try:
        settings = {s: parse_settings(s) for s in args.settings}
    except ValueError:
        parser.error(f"--settings takes 'default' or BLOCK_M/BLOCK_N/WARPS/STAGES, e.g. 64/64/4/2; got {args.settings}")
    set_model_shape(args.model)
    rows = []
    for kind in args.kv_cache_dtype:
        for name in args.steps:
            query_lens, context_lens = STEPS[name]
            q, cache, meta = make_step(query_lens, context_lens, kind)
            runs = {s: (lambda s=s: prefill_attention(q, cache, meta.block_tables, meta.context_lens,
                                                      meta.cu_seqlens_q, meta.max_seqlen_q, HEAD_DIM ** -0.5,
                                                      settings=settings[s]))
                    for s in args.settings}
            if meta.num_decodes:
                backend, whole = TritonBackend(), dataclasses.replace(meta, num_decodes=0)
                runs = {"decode rows split": lambda: backend.forward(q, cache, meta, HEAD_DIM ** -0.5),
                        "in one launch": lambda: backend.forward(q, cache, whole, HEAD_DIM ** -0.5)}
            for setting, fn in runs.items():
                ms = do_bench(fn, warmup=20, rep=200, return_mode="median")
                rows.append({"kv_cache_dtype": kind, "step": name, "setting": setting, "ms": round(ms, 4),
                             "tflop_per_s": round(flops(query_lens, context_lens) / ms / 1e9, 1)})
                print(json.dumps(rows[-1]))
    save_record({"gpu": torch.cuda.get_device_name(), "model": args.model, "command": "python " + " ".join(sys.argv),
                 "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "timings": rows}, args.out)


if __name__ == "__main__":
    main()
