"""Decode/prefill attention timings of one checkout, K token-major and head-major (a permuted view):
    python benchmark_results/kv_int8_cache/experiments/decode_ab_2026_12_04.py ROOT LABEL  -> JSON lines
(ROOT: a checkout of nanovllm; run two checkouts alternately for an A/B)."""
import json
import sys

root, label = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import nanovllm  # noqa: E402
from nanovllm.attention.metadata import decode_order  # noqa: E402
from nanovllm.attention.triton_decode import decode_attention  # noqa: E402
from nanovllm.attention.triton_prefill import prefill_attention  # noqa: E402
from nanovllm.quant.kv import LayerKVCache, quantize_ref, quantized_cache  # noqa: E402

assert nanovllm.__file__.startswith(root), nanovllm.__file__
LayerKVCache.check_storage = lambda self: None     # head-major K is a non-contiguous view
heads, kv_heads, hd, bs = 16, 8, 128, 256
gen = torch.Generator().manual_seed(0)


def make_cache(num_blocks, kind, k_layout):
    k, v = (torch.randn(num_blocks, bs, kv_heads, hd, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    if kind == "auto":
        cache = LayerKVCache(k, v)
    else:
        (kq, ks), (vq, vs) = quantize_ref(k, kind), quantize_ref(v, kind)
        cache = quantized_cache(kq, vq, ks, vs)
    if k_layout == "head":
        cache.k = cache.k.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    return cache


def timed(fn, rep):
    return round(do_bench(fn, warmup=30, rep=rep, return_mode="median") * 1e3, 2)


out = []
for name, batch, lo, hi in (("decode 64x8k", 64, 8192, 8192), ("decode 256x100..2048", 256, 100, 2048),
                            ("decode 32x100..2048", 32, 100, 2048)):
    per = hi // bs
    lens = torch.randint(lo, hi + 1, (batch,), dtype=torch.int32, generator=gen)
    order = torch.from_numpy(decode_order(lens.numpy())).cuda()
    tables = torch.randperm(batch * per, device="cuda").view(batch, per).int()
    lens = lens.cuda()
    q = torch.randn(batch, heads, hd, dtype=torch.bfloat16, device="cuda")
    for kind in ("auto", "int8", "fp8"):
        for k_layout in ("token", "head"):
            cache = make_cache(batch * per, kind, k_layout)
            ref = decode_attention(q, cache, tables, lens, hd ** -0.5, 1, order=order)
            us = timed(lambda: decode_attention(q, cache, tables, lens, hd ** -0.5, 1, order=order), 300)
            rec = {"label": label, "case": name, "kv": kind, "k_layout": k_layout, "us": us}
            print(json.dumps(rec), flush=True)
            del cache

q_lens = torch.randint(100, 1025, (32,), dtype=torch.int32, generator=gen)
cu = torch.zeros(33, dtype=torch.int32)
cu[1:] = q_lens.cumsum(0)
per = 1024 // bs
tables = torch.randperm(32 * per, device="cuda").view(32, per).int()
q = torch.randn(int(cu[-1]), heads, hd, dtype=torch.bfloat16, device="cuda")
ctx, cu, max_q = q_lens.cuda(), cu.cuda(), int(q_lens.max())
for kind in ("auto", "int8", "fp8"):
    for k_layout in ("token", "head"):
        cache = make_cache(32 * per, kind, k_layout)
        us = timed(lambda: prefill_attention(q, cache, tables, ctx, cu, max_q, hd ** -0.5), 200)
        print(json.dumps({"label": label, "case": f"prefill 32x100..1024 ({q.shape[0]} tokens)", "kv": kind,
                          "k_layout": k_layout, "us": us}), flush=True)
