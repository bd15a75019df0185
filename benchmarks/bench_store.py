"""Store-kernel microbenchmark: the time to write one step's K and V into the cache, per KV cache dtype.

    python benchmarks/bench_store.py

Qwen3-0.6B's KV shape (8 KV heads, head_dim 128), one layer, 256-token blocks. Two steps of bench.py:
a prefill of 64 prompts of 250 tokens, each in its own fresh block, and a decode step of 256 tokens in
scattered blocks. The prefill is timed twice: by aligned windows of each prompt (`store_prompt_kv`, what the
engine runs) and with one program per token (`store_kv`, the decode kernel). Timed inside a CUDA graph, as
the engine's decode steps run. K and V arrive as views of a fused qkv output, as in the model.
Prints one JSON line per case and writes them to results/kv_int8_cache/store.json (untracked), or to the
path given as its one argument.
"""
import json
import os
import sys
from datetime import datetime, timezone

import torch
from triton.testing import do_bench_cudagraph

from nanovllm.attention.metadata import AttentionMetadata
from nanovllm.attention.triton_store import store_kv, store_prompt_kv
from nanovllm.quant.kv import allocate
from nanovllm.utils.results import results_path

NUM_KV_HEADS, HEAD_DIM, NUM_HEADS, BLOCK_SIZE, NUM_BLOCKS = 8, 128, 16, 256, 4096
STEPS = {"prefill 64 x 250": [250] * 64, "decode 256": [1] * 256}


def step_inputs(lengths: list[int]):
    """(k, v, slot_mapping, prefill metadata): one sequence per length, each starting a block of its own."""
    blocks = torch.randperm(NUM_BLOCKS, device="cuda")[:len(lengths)]
    slots = torch.cat([block * BLOCK_SIZE + torch.arange(n, device="cuda") for block, n in zip(blocks, lengths)])
    qkv = torch.randn(len(slots), (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    k, v = qkv[:, NUM_HEADS * HEAD_DIM:].unflatten(1, (2, NUM_KV_HEADS, HEAD_DIM)).unbind(1)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    meta = AttentionMetadata(
        is_prefill=True, slot_mapping=slots, context_lens=torch.tensor(lengths, dtype=torch.int32, device="cuda"),
        block_tables=blocks.int()[:, None], cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device="cuda"),
        max_seqlen_q=max(lengths), max_seqlen_k=max(lengths), context_lens_cpu=lengths, cu_seqlens_q_cpu=cu)
    return k, v, slots.int(), meta


def main():
    torch.manual_seed(0)
    records = []
    for kind in ("auto", "int8", "fp8"):
        (cache,) = allocate(1, (NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM), kind, torch.bfloat16,
                            torch.device("cuda"))
        for step, lengths in STEPS.items():
            k, v, slots, meta = step_inputs(lengths)
            kernels = {"by token": lambda: store_kv(k, v, cache, slots)}
            if step.startswith("prefill"):
                kernels["by window"] = lambda: store_prompt_kv(k, v, cache, meta)
            for kernel, store in kernels.items():
                us = do_bench_cudagraph(store, rep=200, return_mode="median") * 1e3
                records.append({"kv_cache_dtype": kind, "step": step, "tokens": len(slots), "kernel": kernel,
                                "us": round(us, 2), "gpu": torch.cuda.get_device_name(),
                                "command": "python " + " ".join(sys.argv),
                                "date": datetime.now(timezone.utc).isoformat(timespec="seconds")})
                print(json.dumps(records[-1]))
    out = sys.argv[1] if len(sys.argv) > 1 else results_path("kv_int8_cache", "store.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(records, f, indent=2)


if __name__ == "__main__":
    main()
