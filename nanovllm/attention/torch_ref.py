"""Plain-PyTorch paged attention: the CPU path and the reference every kernel is checked against.

Cache layout (per layer, see quant/kv.py): values [num_blocks, block_size, num_kv_heads, head_dim] for K
and for V, and for INT8/FP8 caches a float32 scale per token and head, [num_blocks, block_size,
num_kv_heads]. Token t of a sequence lives in block block_table[t // block_size] at offset
t % block_size, so its flat slot is block_table[t // block_size] * block_size + t % block_size.
"""
import torch

from nanovllm.attention.metadata import AttentionMetadata
from nanovllm.quant.kv import LayerKVCache, dequantize_ref, quantize_ref


def dot_precision(dtype: torch.dtype) -> str:
    """Triton kernels keep float32 models in true float32 (no TF32), so they agree with this reference."""
    return "ieee" if dtype == torch.float32 else "tf32"


def kv_cache_kind(cache: LayerKVCache) -> str:
    if not cache.quantized:
        return "auto"
    return "int8" if cache.k.dtype == torch.int8 else "fp8"


def store_kv_ref(k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache, slot_mapping: torch.Tensor) -> None:
    """Write k, v [num_tokens, num_kv_heads, head_dim] at slot_mapping (-1: skip), quantizing if asked."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    kind = kv_cache_kind(cache)
    for x, values, scales in ((k, cache.k, cache.k_scale), (v, cache.v, cache.v_scale)):
        flat = values.view(-1, *values.shape[2:])
        if kind == "auto":
            flat[slots] = x[keep].to(values.dtype)
        else:
            q, s = quantize_ref(x[keep], kind)
            flat[slots] = q
            scales.view(-1, scales.shape[-1])[slots] = s


def gather_kv(values: torch.Tensor, scales: torch.Tensor | None, block_table: torch.Tensor,
              context_len: int) -> torch.Tensor:
    """The first context_len tokens of one sequence, [context_len, num_kv_heads, head_dim], dequantized
    to float32 when the cache is quantized."""
    block_size = values.shape[1]
    blocks = block_table[:(context_len + block_size - 1) // block_size].long()
    x = values[blocks].flatten(0, 1)[:context_len]
    if scales is None:
        return x
    return dequantize_ref(x, scales[blocks].flatten(0, 1)[:context_len])


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of q [n_q, Hq, D] over k, v [n_k, Hkv, D], with q being the last n_q positions.

    Query i sits at position n_k - n_q + i and sees keys 0..that position. Math in float32.
    """
    n_q, num_heads, _ = q.shape
    n_k, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.float().repeat_interleave(group, dim=1)   # [n_k, Hq, D]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    q_pos = torch.arange(n_k - n_q, n_k, device=q.device)[:, None]
    k_pos = torch.arange(n_k, device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
    return out.to(q.dtype)


def paged_attention_ref(q: torch.Tensor, cache: LayerKVCache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Attention for a flat batch q [num_tokens, Hq, D] reading K/V through block tables."""
    out = torch.empty_like(q)
    cu = meta.cu_seqlens_q_cpu
    for i, context_len in enumerate(meta.context_lens_cpu):
        k = gather_kv(cache.k, cache.k_scale, meta.block_tables[i], context_len)
        v = gather_kv(cache.v, cache.v_scale, meta.block_tables[i], context_len)
        out[cu[i]:cu[i + 1]] = attention_ref(q[cu[i]:cu[i + 1]], k, v, scale)
    return out


class TorchBackend:
    """Reference backend: scatter into the cache, gather per sequence, attend in float32."""
    name = "torch"
    supports_cuda_graphs = False      # it reads host-side lengths
    kv_cache_dtypes = ("auto", "int8", "fp8")

    def plan_decode(self, num_seqs: int, num_kv_heads: int, max_context_len: int) -> int:
        return 1

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int):
        return (num_blocks, block_size, num_kv_heads, head_dim)

    def store_kv(self, k, v, cache: LayerKVCache, meta: AttentionMetadata) -> None:
        store_kv_ref(k, v, cache, meta.slot_mapping)

    def forward(self, q, cache: LayerKVCache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        return paged_attention_ref(q, cache, meta, scale)
