"""The attention backend interface, and choosing a backend by name (backends are imported only when chosen)."""
import importlib
import importlib.util
from typing import Protocol, runtime_checkable

import torch

from nanovllm.attention.metadata import AttentionMetadata
from nanovllm.quant.kv import LayerKVCache


@runtime_checkable
class AttentionBackend(Protocol):
    """What the attention layer and the model runner ask of a backend."""
    name: str
    supports_cuda_graphs: bool     # decode steps can be captured (no host value read in a step)
    supports_mixed_graphs: bool    # steps with prefill chunks too (engine/cuda_graph.py MixedGraphs)
    supports_cascade: bool         # decode reads a prefix shared by many rows once (meta.shared)
    kv_cache_dtypes: tuple[str, ...]

    def plan_decode(self, num_seqs: int, num_kv_heads: int, max_context_len: int) -> int:
        """The decode kernel's split-KV factor for a batch (1: no split)."""

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple:
        """One layer's K (and V) cache shape; raises ValueError for a layout the backend cannot serve."""

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache, meta: AttentionMetadata) -> None:
        """Write this step's K/V into the cache."""

    def forward(self, q: torch.Tensor, cache: LayerKVCache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Attention of this step's queries over the cache (their own K/V already stored)."""

_BACKENDS = {
    "torch": ("nanovllm.attention.torch_ref", "TorchBackend"),
    "triton": ("nanovllm.attention.triton_backend", "TritonBackend"),
    "flash_attn": ("nanovllm.attention.flash_attn_backend", "FlashAttnBackend"),
}


def resolve_backend_name(name: str, device: str, kv_cache_dtype: str = "auto") -> str:
    """'auto': flash_attn when installed on CUDA (and the cache is 16-bit: it has no INT8/FP8 cache), else
    triton on CUDA, else the torch reference."""
    if name != "auto":
        if name != "torch" and device != "cuda":
            raise ValueError(f"attention_backend={name!r} needs a CUDA device; on {device} use 'torch' or 'auto'")
        return name
    if device != "cuda":
        return "torch"
    if kv_cache_dtype == "auto" and importlib.util.find_spec("flash_attn"):
        return "flash_attn"
    return "triton"


def get_attention_backend(name: str, device: str, kv_cache_dtype: str = "auto") -> AttentionBackend:
    name = resolve_backend_name(name, device, kv_cache_dtype)
    if name not in _BACKENDS:
        raise ValueError(f"attention_backend={name!r} is not available; choose one of {['auto', *_BACKENDS]}")
    module, cls = _BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
