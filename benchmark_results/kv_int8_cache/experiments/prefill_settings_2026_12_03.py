"""Prefill attention per KV dtype and launch setting, on one bench-like prefill step: 29 prompts of 100..1,024
tokens (17,547 tokens), Qwen3-0.6B's heads. H200 run: 2026-12-03 17:45, prefill-settings-2026-12-03.json.

    PYTHONPATH=. python benchmark_results/kv_int8_cache/experiments/prefill_settings_2026_12_03.py OUT.json

`diff` is the largest difference from the output at the former setting (64 queries, 32 keys, 4 warps,
2 stages); INT8 rounds P per row of each key tile, so its tile length changes the rounding.
"""
import itertools
import json
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, "tests")
from attention_cases import make_case  # noqa: E402

from nanovllm.attention.triton_prefill import prefill_attention  # noqa: E402

SETTINGS = list(itertools.product((64, 128), (32, 64), (4, 8), (2,))) + [(64, 128, 4, 2), (64, 128, 8, 2)]


def launch(q, cache, meta, block_m, block_n, num_warps, num_stages):
    settings = {"block_m": block_m, "block_n": block_n, "num_warps": num_warps, "num_stages": num_stages}
    return prefill_attention(q, cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q, meta.max_seqlen_q,
                             0.1, settings)


def main():
    lens = torch.randint(100, 1025, (29,), generator=torch.Generator().manual_seed(0)).tolist()
    rows = []
    for kind in ("auto", "int8", "fp8"):
        q, cache, meta = make_case(lens, lens, 16, 8, 128, 256, torch.bfloat16, "cuda", kv_cache_dtype=kind)
        former = launch(q, cache, meta, 64, 32, 4, 2)
        for setting in SETTINGS:
            out = launch(q, cache, meta, *setting)
            ms = do_bench(lambda: launch(q, cache, meta, *setting), warmup=5, rep=30, return_mode="median")
            rows.append(dict(kind=kind, block_m=setting[0], block_n=setting[1], warps=setting[2], stages=setting[3],
                             ms=round(ms, 4), diff=round((out.float() - former.float()).abs().max().item(), 4)))
            print(json.dumps(rows[-1]), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
