"""bench.py's first decode step (256 sequences, contexts 101..1025): one layer's decode attention, 8 launches
(for Nsight Compute; run from the repository root)."""
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "tests/kv_quant")
import torch  # noqa: E402
from bench_decode_steps import HEAD_DIM, bench_steps, make_cache  # noqa: E402

from nanovllm.attention.metadata import decode_order  # noqa: E402
from nanovllm.attention.triton_decode import decode_attention  # noqa: E402

kind = sys.argv[1]
step, running = bench_steps(32)[0]
cache = make_cache(kind, 256 * 16)
tables = torch.randperm(256 * 16, device="cuda").view(256, 16).int()
q = torch.randn(256, 16, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
order = torch.from_numpy(decode_order(running)).cuda()
ctx = torch.tensor(running, dtype=torch.int32, device="cuda")
for _ in range(8):
    decode_attention(q, cache, tables, ctx, HEAD_DIM ** -0.5, 1, order=order)
torch.cuda.synchronize()
