"""Random paged-attention problems shared by the kernel tests: a cache, block tables, queries."""
import random

import torch

from nanovllm.attention.metadata import AttentionMetadata
from nanovllm.quant.kv import LayerKVCache, quantize_ref, quantized_cache


def make_cache(shape, dtype, device, kv_cache_dtype="auto") -> LayerKVCache:
    """Random K/V values (quantized with the reference when asked)."""
    k, v = (torch.randn(shape, dtype=dtype, device=device) for _ in range(2))
    if kv_cache_dtype == "auto":
        return LayerKVCache(k, v)
    (kq, ks), (vq, vs) = quantize_ref(k, kv_cache_dtype), quantize_ref(v, kv_cache_dtype)
    return quantized_cache(kq, vq, ks, vs)


def make_case(query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device, seed=0,
              kv_cache_dtype="auto"):
    """Sequence i has context_lens[i] tokens in the cache, the last query_lens[i] of which are queries.
    Blocks are scattered at random over the pool, as after a long run."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    blocks_per_seq = [(c + block_size - 1) // block_size for c in context_lens]
    num_blocks = sum(blocks_per_seq) + 3
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    tables = torch.full((len(context_lens), max(blocks_per_seq)), -1, dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = torch.tensor([pool.pop() for _ in range(n)], dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    cache = make_cache(shape, dtype, device, kv_cache_dtype)
    q = torch.randn(sum(query_lens), num_heads, head_dim, dtype=dtype, device=device)
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    meta = AttentionMetadata(
        is_prefill=True, slot_mapping=torch.empty(0, dtype=torch.int64, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device), cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
        max_seqlen_q=max(query_lens), max_seqlen_k=max(context_lens),
        context_lens_cpu=list(context_lens), cu_seqlens_q_cpu=cu)
    return q, cache, meta


def slots_for(meta, block_size, query_lens):
    """Cache slots of every query token (the last query_lens[i] positions of sequence i)."""
    slots = []
    for i, (n, ctx) in enumerate(zip(query_lens, meta.context_lens_cpu)):
        for pos in range(ctx - n, ctx):
            slots.append(int(meta.block_tables[i, pos // block_size]) * block_size + pos % block_size)
    return torch.tensor(slots, dtype=torch.int64, device=meta.block_tables.device)


def rel_err(a, b) -> float:
    """Relative error of a against b (Frobenius norms, float32)."""
    return ((a.float() - b.float()).norm() / b.float().norm()).item()
