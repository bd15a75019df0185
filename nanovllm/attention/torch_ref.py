"""Plain-PyTorch paged attention: the CPU path and the reference every kernel is checked against.

Cache layout (per layer, see quant/kv.py): values [num_blocks, block_size, num_kv_heads, head_dim] for K
and for V (a quantized V is stored in groups of keys; `LayerKVCache.v_groups` views it per slot), and for
INT8/FP8 caches a float32 scale per token and head, viewed [num_blocks, block_size, num_kv_heads]. Token t of a
sequence lives in block block_table[t // block_size] at offset t % block_size, so its flat slot is
block_table[t // block_size] * block_size + t % block_size.
"""
import math

import torch

from nanovllm.attention.metadata import AttentionMetadata
from nanovllm.quant.kv import LayerKVCache, dequantize_ref, quantize_ref


def kv_cache_kind(cache: LayerKVCache) -> str:
    if not cache.quantized:
        return "auto"
    return "int8" if cache.k.dtype == torch.int8 else "fp8"


def store_kv_ref(k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache, slot_mapping: torch.Tensor) -> None:
    """Write k, v [num_tokens, num_kv_heads, head_dim] at slot_mapping (-1: skip), quantizing if asked."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    kind = kv_cache_kind(cache)
    block_size = cache.k.shape[1]
    blocks, rows = slots // block_size, slots % block_size
    # both as [num_blocks, groups, G, num_kv_heads, head_dim] views, so one index writes either
    group = cache.v_groups.shape[2]
    k_groups = cache.k.unflatten(1, (-1, group))
    for x, values, scales in ((k, k_groups, cache.k_scale), (v, cache.v_groups, cache.v_scale)):
        index = (blocks, rows // group, rows % group)
        if kind == "auto":
            values[index] = x[keep].to(values.dtype)
        else:
            q, s = quantize_ref(x[keep], kind)
            values[index] = q
            scales[blocks, rows] = s


def gather_kv(values: torch.Tensor, scales: torch.Tensor | None, block_table: torch.Tensor,
              context_len: int) -> torch.Tensor:
    """The first context_len tokens of one sequence, [context_len, num_kv_heads, head_dim], dequantized
    to float32 when the cache is quantized. values: [num_blocks, block_size, num_kv_heads, head_dim] or a
    grouped view [num_blocks, groups, G, num_kv_heads, head_dim] (`LayerKVCache.v_groups`)."""
    block_size = math.prod(values.shape[1:-2])
    blocks = block_table[:(context_len + block_size - 1) // block_size].long()
    x = values[blocks].reshape(-1, *values.shape[-2:])[:context_len]
    if scales is None:
        return x
    return dequantize_ref(x, gather_scales(scales, block_table, context_len))


def gather_scales(scales: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """The first context_len tokens' scales of one sequence, [context_len, num_kv_heads], of scales viewed
    [num_blocks, block_size, num_kv_heads]."""
    block_size = scales.shape[1]
    blocks = block_table[:(context_len + block_size - 1) // block_size].long()
    return scales[blocks].flatten(0, 1)[:context_len]


INT8_TILE = 64   # keys per tile over which P is rounded for INT8 dots (the kernels' BLOCK_N; theirs may differ)


def round_rows_to_int8_ref(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] rounded to INT8 steps per row (max |x| -> 127, half to even, as the kernels' float adder
    rounds: triton_tiles.round_rows_to_int8), as float32 values."""
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127
    return (x * (1 / scale)).round_().mul_(scale)   # in place: real-size prefill is GBs


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q [n_q, Hq, D] over k, v [n_k, Hkv, D], with q being the last n_q positions.

    Query i sits at position n_k - n_q + i and sees keys 0..that position. Math in float32. With v_scale
    [n_k, Hkv] (an INT8 cache, k and v dequantized) the math of the INT8 dots (triton_tiles.int8_scores /
    int8_pv): q rounded per row to INT8, and the probabilities times V's scales rounded per row within each
    tile of INT8_TILE keys.
    """
    n_q, num_heads, _ = q.shape
    n_k, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    dtype, q = q.dtype, (q.float() if v_scale is None else round_rows_to_int8_ref(q.float()))
    k = k.float().repeat_interleave(group, dim=1)   # [n_k, Hq, D]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    q_pos = torch.arange(n_k - n_q, n_k, device=q.device)[:, None]
    k_pos = torch.arange(n_k, device=q.device)[None, :]
    probs = scores.masked_fill_(k_pos > q_pos, float("-inf")).softmax(dim=-1)
    del scores
    if v_scale is not None:
        probs = round_probs_per_tile_ref(probs, v_scale.float().repeat_interleave(group, dim=1).t()[:, None, :])
    out = torch.einsum("hqk,khd->qhd", probs, v)
    return out.to(dtype)


def round_probs_per_tile_ref(probs: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
    """probs [Hq, n_q, n_k] as the INT8 P @ V sees them: times V's per-key scales (v_scale [Hq, 1, n_k]),
    rounded per row of each INT8_TILE-key tile, divided by the scales again (V is then dequantized)."""
    n_k = probs.shape[-1]
    tiles = pad_to_multiple(probs * v_scale, INT8_TILE).unflatten(-1, (-1, INT8_TILE))   # [Hq, n_q, tiles, INT8_TILE]
    rounded = round_rows_to_int8_ref(tiles).flatten(-2)[..., :n_k]
    return rounded / v_scale.clamp_min(1e-30)


def pad_to_multiple(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """x zero-padded on its last dimension to a multiple of `multiple`."""
    return torch.nn.functional.pad(x, (0, -x.shape[-1] % multiple))


def paged_attention_ref(q: torch.Tensor, cache: LayerKVCache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Attention for a flat batch q [num_tokens, Hq, D] reading K/V through block tables."""
    out = torch.empty_like(q)
    cu = meta.cu_seqlens_q_cpu
    int8 = kv_cache_kind(cache) == "int8"
    for i, context_len in enumerate(meta.context_lens_cpu):
        k = gather_kv(cache.k, cache.k_scale, meta.block_tables[i], context_len)
        v = gather_kv(cache.v_groups, cache.v_scale, meta.block_tables[i], context_len)
        v_scale = gather_scales(cache.v_scale, meta.block_tables[i], context_len) if int8 else None
        out[cu[i]:cu[i + 1]] = attention_ref(q[cu[i]:cu[i + 1]], k, v, scale, v_scale)
    return out


class TorchBackend:
    """Reference backend: scatter into the cache, gather per sequence, attend in float32."""
    name = "torch"
    supports_cuda_graphs = False      # it reads host-side lengths
    supports_mixed_graphs = False
    supports_cascade = False
    kv_cache_dtypes = ("auto", "int8", "fp8")

    def plan_decode(self, num_seqs: int, num_kv_heads: int, max_context_len: int) -> int:
        return 1

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int):
        return (num_blocks, block_size, num_kv_heads, head_dim)

    def store_kv(self, k, v, cache: LayerKVCache, meta: AttentionMetadata) -> None:
        store_kv_ref(k, v, cache, meta.slot_mapping)

    def forward(self, q, cache: LayerKVCache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        return paged_attention_ref(q, cache, meta, scale)
