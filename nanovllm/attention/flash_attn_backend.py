"""flash-attn backend (optional extra `pip install nanovllm[flash-attn]`): used when the package imports.

Prefill: flash_attn_varlen_func with block_table (reads prefix-cache hits and earlier chunks from the
paged cache); decode: flash_attn_with_kvcache. flash-attn's paged kernels need block_size % 256 == 0.
"""
import torch

from nanovllm.attention.metadata import AttentionMetadata
from nanovllm.attention.triton_store import store_step_kv

try:
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
except ImportError as e:  # the backend registry turns this into advice
    raise ImportError("attention_backend='flash_attn' needs the flash-attn package: "
                      "pip install 'nanovllm[flash-attn]'") from e


class FlashAttnBackend:
    name = "flash_attn"
    supports_cuda_graphs = True
    supports_mixed_graphs = False
    supports_cascade = False     # its prefill grid follows the step's longest chunk
    kv_cache_dtypes = ("auto",)

    def plan_decode(self, num_seqs: int, num_kv_heads: int, max_context_len: int) -> int:
        return 1      # flash-attn splits internally

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int):
        if block_size % 256:
            raise ValueError(f"attention_backend='flash_attn' needs kvcache_block_size % 256 == 0, got {block_size}")
        return (num_blocks, block_size, num_kv_heads, head_dim)

    def store_kv(self, k, v, cache, meta: AttentionMetadata) -> None:
        store_step_kv(k, v, cache, meta)

    def forward(self, q, cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        k_cache, v_cache = cache.k, cache.v
        if meta.is_prefill:
            cu_k = torch.nn.functional.pad(meta.context_lens.cumsum(0, dtype=torch.int32), (1, 0))
            return flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=meta.cu_seqlens_q, cu_seqlens_k=cu_k,
                                          max_seqlen_q=meta.max_seqlen_q, max_seqlen_k=meta.max_seqlen_k,
                                          softmax_scale=scale, causal=True, block_table=meta.block_tables)
        out = flash_attn_with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=meta.context_lens,
                                      block_table=meta.block_tables, softmax_scale=scale, causal=True)
        return out.squeeze(1)
