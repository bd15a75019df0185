"""A/B timing of the attention kernels: python scratch/ab.py ROOT LABEL (ROOT: a checkout of nanovllm)."""
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
heads, kv_heads, hd, bs = 16, 8, 128, 256
gen = torch.Generator().manual_seed(0)


def make_cache(num_blocks, kind):
    k, v = (torch.randn(num_blocks, bs, kv_heads, hd, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    if kind == "auto":
        return LayerKVCache(k, v)
    (kq, ks), (vq, vs) = quantize_ref(k, kind), quantize_ref(v, kind)
    return quantized_cache(kq, vq, ks, vs)


for name, batch, lo, hi in (("decode 64x8k", 64, 8192, 8192), ("decode 256x100..2048", 256, 100, 2048)):
    per = hi // bs
    lens = torch.randint(lo, hi + 1, (batch,), dtype=torch.int32, generator=gen)
    order = torch.from_numpy(decode_order(lens.numpy())).cuda()
    tables = torch.randperm(batch * per, device="cuda").view(batch, per).int()
    lens = lens.cuda()
    q = torch.randn(batch, heads, hd, dtype=torch.bfloat16, device="cuda")
    for kind in ("auto", "int8", "fp8"):
        cache = make_cache(batch * per, kind)
        ms = do_bench(lambda: decode_attention(q, cache, tables, lens, hd ** -0.5, 1, order=order), warmup=50,
                      rep=300, return_mode="median")
        print(json.dumps({"label": label, "case": name, "kv": kind, "us": round(ms * 1e3, 2)}), flush=True)
        del cache

# one prefill step of bench.py: 32 prompts of 100..1024 tokens
q_lens = torch.randint(100, 1025, (32,), dtype=torch.int32, generator=gen)
cu = torch.zeros(33, dtype=torch.int32)
cu[1:] = q_lens.cumsum(0)
per = 1024 // bs
tables = torch.randperm(32 * per, device="cuda").view(32, per).int()
q = torch.randn(int(cu[-1]), heads, hd, dtype=torch.bfloat16, device="cuda")
ctx, cu, max_q = q_lens.cuda(), cu.cuda(), int(q_lens.max())
for kind in ("auto", "int8", "fp8"):
    cache = make_cache(32 * per, kind)
    ms = do_bench(lambda: prefill_attention(q, cache, tables, ctx, cu, max_q,
                                            hd ** -0.5), warmup=20, rep=200, return_mode="median")
    print(json.dumps({"label": label, "case": f"prefill 32x100..1024 ({q.shape[0]} tokens)", "kv": kind,
                      "us": round(ms * 1e3, 2)}), flush=True)
