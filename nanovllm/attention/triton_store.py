"""Store kernel: write this step's K and V into the paged cache at `slot_mapping`.

k, v: [num_tokens, num_kv_heads, head_dim], each token's heads contiguous (they may be strided views of the
fused qkv output). Cache: [num_blocks, block_size, num_kv_heads, head_dim], contiguous, so slot s starts at
element s * num_kv_heads * head_dim. One program per token copies its num_kv_heads * head_dim values;
slot -1 (padding in a CUDA graph batch) is skipped. Reference: `store_kv_ref`.
"""
import torch
import triton
import triton.language as tl

from nanovllm.attention.torch_ref import store_kv_ref

__all__ = ["store_kv", "store_kv_ref"]


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, stride_k, stride_v,
                     ROW: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        offs = tl.arange(0, BLOCK)
        mask = offs < ROW
        k = tl.load(k_ptr + token * stride_k + offs, mask=mask)
        v = tl.load(v_ptr + token * stride_v + offs, mask=mask)
        tl.store(k_cache_ptr + slot * ROW + offs, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + slot * ROW + offs, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    num_tokens, num_kv_heads, head_dim = k.shape
    assert v.shape == k.shape and slot_mapping.shape == (num_tokens,)
    assert k.stride(-1) == 1 and k.stride(-2) == head_dim and v.stride(-1) == 1 and v.stride(-2) == head_dim
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[2:] == (num_kv_heads, head_dim)
    row = num_kv_heads * head_dim
    _store_kv_kernel[(num_tokens,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
                                    ROW=row, BLOCK=triton.next_power_of_2(row))
