"""KV cache dtypes: the model's dtype, or INT8 / FP8 (e4m3) with a scale per token and KV head.

Quantization of one head vector x (head_dim values) when it is written to the cache:
    scale = max|x| / QMAX          (QMAX = 127 for int8, 448 for fp8 e4m3; a zero vector gets a tiny scale)
    q     = round(x / scale)       (int8, half away from zero, within [-127, 127])   or   fp8(x / scale)
and when attention reads it:  x' = q * scale, in float32, then the model's dtype.
Per token and per head, because K/V outliers sit in a few heads and tokens: one scale per head vector keeps
each vector's full range. Scales are float32 in tensors beside the cache, [num_blocks, block_size,
num_kv_heads], so the block tables address them exactly like the values. Capacity: (2 bytes x head_dim) /
(1 byte x head_dim + 4 bytes) = 1.94x the bf16 tokens at head_dim 128.

A quantized cache stores V transposed within each block, [num_blocks, num_kv_heads, head_dim, block_size]
(vLLM's original V layout): the 8-bit tensor-core dot P @ V wants each dimension's keys side by side, and
with the keys contiguous the attention kernels load V tiles straight into that operand layout instead of
gathering bytes (a third of the decode loop's instructions). `LayerKVCache.v_slots` views it per slot.
A quantized cache starts zeroed and the store writes no NaN, so any bytes of an allocated block can be
read and multiplied by a zero probability (the kernels skip masking V inside a block).
"""
from dataclasses import dataclass

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
QMAX = {"int8": 127.0, "fp8": 448.0}
STORAGE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
MIN_SCALE = 1e-8


@dataclass
class LayerKVCache:
    """One attention layer's cache: K [num_blocks, block_size, num_kv_heads, head_dim]; V the same, or
    [num_blocks, num_kv_heads, head_dim, block_size] when quantized; and, when quantized, scales
    [num_blocks, block_size, num_kv_heads]."""
    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def quantized(self) -> bool:
        return self.k_scale is not None

    @property
    def v_slots(self) -> torch.Tensor:
        """V as [num_blocks, block_size, num_kv_heads, head_dim], whatever its storage (a view)."""
        return self.v.permute(0, 3, 1, 2) if self.quantized else self.v


def quantized_cache(k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor) -> LayerKVCache:
    """A quantized cache from values k, v [num_blocks, block_size, num_kv_heads, head_dim] and their scales,
    V copied into its transposed storage."""
    return LayerKVCache(k, v.permute(0, 2, 3, 1).contiguous(), k_scale, v_scale)


def storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    return model_dtype if kv_cache_dtype == "auto" else STORAGE[kv_cache_dtype]


def bytes_per_token(kv_cache_dtype: str, model_dtype: torch.dtype, num_kv_heads: int, head_dim: int) -> int:
    """K and V of one token in one layer, scales included."""
    values = num_kv_heads * head_dim * storage_dtype(kv_cache_dtype, model_dtype).itemsize
    scales = 0 if kv_cache_dtype == "auto" else num_kv_heads * 4
    return 2 * (values + scales)


def quantize_ref(x: torch.Tensor, kv_cache_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (q of the storage dtype, scale [...] float32)."""
    x = x.float()
    scale = (x.abs().amax(dim=-1) / QMAX[kv_cache_dtype]).clamp(min=MIN_SCALE)
    y = x / scale[..., None]
    if kv_cache_dtype == "int8":   # round half away from zero, as the Triton store kernel does
        return (y.sign() * (y.abs() + 0.5).floor()).clamp(-127, 127).to(torch.int8), scale
    return y.to(torch.float8_e4m3fn), scale


def dequantize_ref(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of q [..., head_dim] with scale [...]."""
    return q.float() * scale[..., None]


def allocate(num_layers: int, shape: tuple, kv_cache_dtype: str, model_dtype: torch.dtype,
             device: torch.device) -> list[LayerKVCache]:
    """One contiguous tensor for all values (and one for all scales), viewed per layer. `shape` is
    [num_blocks, block_size, num_kv_heads, head_dim]; a quantized V is viewed transposed within its blocks."""
    dtype = storage_dtype(kv_cache_dtype, model_dtype)
    if kv_cache_dtype == "auto":
        values = torch.empty((2, num_layers, *shape), dtype=dtype, device=device)
        return [LayerKVCache(values[0, i], values[1, i]) for i in range(num_layers)]
    num_blocks, block_size, num_kv_heads, head_dim = shape
    values = torch.zeros((2, num_layers, *shape), dtype=dtype, device=device)   # zeroed: no NaN bytes anywhere
    scales = torch.ones((2, num_layers, *shape[:-1]), dtype=torch.float32, device=device)
    return [LayerKVCache(values[0, i], values[1, i].view(num_blocks, num_kv_heads, head_dim, block_size),
                         scales[0, i], scales[1, i]) for i in range(num_layers)]
