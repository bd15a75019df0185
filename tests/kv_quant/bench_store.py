"""Store-kernel microbenchmark: the time to write one step's K and V into the cache, per KV cache dtype.

    python tests/kv_quant/bench_store.py

Qwen3-0.6B's KV shape (8 KV heads, head_dim 128), one layer, 256-token blocks. Two steps of bench.py:
a prefill of 64 prompts of 250 tokens, each in its own fresh block, and a decode step of 256 tokens in
scattered blocks. Into a quantized cache the prefill is timed twice: with runs of prompt tokens per program
(the default) and with one program per token (`triton_store.RUN_MIN_TOKENS` raised past the step's size);
a bf16 cache always stores token by token. Timed inside a CUDA graph, as the engine's decode steps run. K
and V arrive as views of a fused qkv output, as in the model. Prints one JSON line per case and writes them to
benchmark_results/kv_int8_cache/store.json.
"""
import json
import sys
from datetime import datetime, timezone

import torch
from triton.testing import do_bench_cudagraph

from nanovllm.attention import triton_store
from nanovllm.attention.triton_store import store_kv
from nanovllm.quant.kv import allocate

NUM_KV_HEADS, HEAD_DIM, NUM_HEADS, BLOCK_SIZE, NUM_BLOCKS = 8, 128, 16, 256, 4096
STEPS = {"prefill 64 x 250": [250] * 64, "decode 256": [1] * 256}


def step_inputs(lengths: list[int]):
    """(k, v, slot_mapping): one sequence per length, each starting a block of its own."""
    blocks = torch.randperm(NUM_BLOCKS, device="cuda")[:len(lengths)].tolist()
    slots = torch.cat([block * BLOCK_SIZE + torch.arange(n, device="cuda") for block, n in zip(blocks, lengths)])
    qkv = torch.randn(len(slots), (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    k, v = qkv[:, NUM_HEADS * HEAD_DIM:].unflatten(1, (2, NUM_KV_HEADS, HEAD_DIM)).unbind(1)
    return k, v, slots.int()


def main():
    torch.manual_seed(0)
    records = []
    run_min_tokens = triton_store.RUN_MIN_TOKENS
    for kind in ("auto", "int8", "fp8"):
        (cache,) = allocate(1, (NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM), kind, torch.bfloat16,
                            torch.device("cuda"))
        for step, lengths in STEPS.items():
            k, v, slots = step_inputs(lengths)
            prefill = step.startswith("prefill")
            for runs in ((True, False) if prefill and kind != "auto" else (False,)):
                triton_store.RUN_MIN_TOKENS = run_min_tokens if runs else len(slots) + 1
                us = do_bench_cudagraph(lambda: store_kv(k, v, cache, slots), rep=200, return_mode="median") * 1e3
                records.append({"kv_cache_dtype": kind, "step": step, "tokens": len(slots), "runs": runs,
                                "us": round(us, 2), "gpu": torch.cuda.get_device_name(),
                                "command": "python " + " ".join(sys.argv),
                                "date": datetime.now(timezone.utc).isoformat(timespec="seconds")})
                print(json.dumps(records[-1]))
    triton_store.RUN_MIN_TOKENS = run_min_tokens
    with open("benchmark_results/kv_int8_cache/store.json", "w") as f:
        json.dump(records, f, indent=2)


if __name__ == "__main__":
    main()
