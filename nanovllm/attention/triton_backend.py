"""Triton backend: the store, prefill and decode kernels behind the backend interface.

A mixed step's attention is two launches on one stream: the decode kernel over its decode rows (bound by
reading their KV cache), then the prefill kernel over its chunks (bound by the tensor cores when chunks are
long). Each writes its own rows of the output. (Both on two streams, so that the GPU might run them at once,
gave no gain: docs/features/triton_attention, "tried, not kept".)
"""
import torch

from nanovllm.attention.metadata import AttentionMetadata
from nanovllm.attention.triton_decode import decode_attention, num_decode_splits
from nanovllm.attention.triton_prefill import prefill_attention
from nanovllm.attention.triton_store import store_step_kv
from nanovllm.quant.kv import LayerKVCache
from nanovllm.utils.tuned import num_sms


class TritonBackend:
    """Paged attention in Triton; any block size that is a multiple of 16, head_dim a power of 2."""
    name = "triton"
    supports_cuda_graphs = True
    supports_mixed_graphs = True      # prefill by tile map, store by slot: no host value in a step's launches
    supports_cascade = True           # decode reads a prefix shared by many rows once (meta.shared)
    kv_cache_dtypes = ("auto", "int8", "fp8")

    def plan_decode(self, num_seqs: int, num_kv_heads: int, max_context_len: int) -> int:
        """Split-KV factor: enough programs to fill every SM when the batch alone does not."""
        device = torch.device("cuda", torch.cuda.current_device())
        return num_decode_splits(num_seqs, num_kv_heads, max_context_len, num_sms(device))

    def kv_cache_shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int):
        if head_dim & (head_dim - 1):
            raise ValueError(f"attention_backend='triton' needs head_dim to be a power of 2, got {head_dim}; "
                             f"use attention_backend='torch'")
        return (num_blocks, block_size, num_kv_heads, head_dim)

    def store_kv(self, k, v, cache: LayerKVCache, meta: AttentionMetadata) -> None:
        store_step_kv(k, v, cache, meta)

    def forward(self, q, cache: LayerKVCache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if not meta.is_prefill:
            return decode_attention(q, cache, meta.block_tables, meta.context_lens, scale, meta.num_decode_splits,
                                    order=meta.decode_order, shared=meta.shared)
        # A mixed step's decode rows (first) go to the decode kernel, which reads each KV head once for all
        # its query heads and splits long contexts; in the prefill kernel each would fill a query tile alone
        # and read its keys once per query head
        if meta.tiles is not None:   # a CUDA graph: a decode launch over its first rows (context 0: no decode)
            out = None
            if meta.decode_context_lens is not None:
                rows = meta.decode_context_lens.shape[0]
                out = torch.empty_like(q)
                decode_attention(q[:rows], cache, meta.block_tables[:rows], meta.decode_context_lens, scale,
                                 meta.num_decode_splits, out=out[:rows])
            return prefill_attention(q, cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q,
                                     meta.max_seqlen_q, scale, tiles=meta.tiles, out=out)
        n = meta.num_decodes
        if n == 0:
            return prefill_attention(q, cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q,
                                     meta.max_seqlen_q, scale)
        out = torch.empty_like(q)
        decode_attention(q[:n], cache, meta.block_tables[:n], meta.context_lens[:n], scale, meta.num_decode_splits,
                         order=meta.decode_order, out=out[:n])
        return prefill_attention(q, cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q,
                                 meta.max_seqlen_q, scale, out=out, first_seq=n)
