"""Store kernel time: a bench-like prefill step (16k tokens in fresh blocks) and a decode step (256 tokens)."""
import json, torch, triton
from nanovllm.attention.triton_store import store_kv
from nanovllm.quant.kv import allocate
torch.manual_seed(0)
H, D, BS = 8, 128, 256
out = {}
for kind in ("auto", "int8", "fp8"):
    (cache,) = allocate(1, (4096, BS, H, D), kind, torch.bfloat16, torch.device("cuda"))
    for name, lens in (("prefill_16k", [250] * 64), ("decode_256", [1] * 256)):
        blocks = torch.randperm(4096, device="cuda")[:len(lens)]
        slots = torch.cat([b * BS + torch.arange(n, device="cuda") for b, n in zip(blocks.tolist(), lens)]).int()
        n = slots.numel()
        qkv = torch.randn(n, (16 + 2 * H) * D, dtype=torch.bfloat16, device="cuda")
        k = qkv[:, 16 * D:(16 + H) * D].view(n, H, D)
        v = qkv[:, (16 + H) * D:].view(n, H, D)
        ms = triton.testing.do_bench(lambda: store_kv(k, v, cache, slots), warmup=50, rep=300)
        out[f"{kind}/{name}"] = round(ms * 1000, 2)
        print(kind, name, n, f"{ms * 1000:.1f} us", flush=True)
print(json.dumps(out))
