"""The attention layer: writes this step's K/V into the paged cache, then attends through it.

The model runner binds each layer's cache tensors and the chosen backend; model code stays the same for
every backend and KV cache dtype.
"""
import torch
from torch import nn

from nanovllm.attention.metadata import get_metadata


class Attention(nn.Module):
    """Paged attention over [num_tokens, heads * head_dim] inputs."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.backend = None
        self.kv_cache = None   # LayerKVCache, bound by the model runner

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = get_metadata()
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        self.backend.store_kv(k, v, self.kv_cache, meta)
        out = self.backend.forward(q, self.kv_cache, meta, self.scale)
        return out.view(-1, self.num_heads * self.head_dim)
