"""KV cache dtypes: the model's dtype, or INT8 / FP8 (e4m3) with a scale per token and KV head.

Quantization of one head vector x (head_dim values) when it is written to the cache:
    scale = max|x| / QMAX          (QMAX = 127 for int8, 448 for fp8 e4m3; a zero vector gets a tiny scale)
    q     = round(x / scale)       (int8, half away from zero, within [-127, 127])   or   fp8(x / scale)
and when attention reads it:  x' = q * scale, in float32, then the model's dtype.
Per token and per head, because K/V outliers sit in a few heads and tokens: one scale per head vector keeps
each vector's full range. Scales are float32 in tensors beside the cache, [num_blocks, block_size,
num_kv_heads], so the block tables address them exactly like the values. Capacity: (2 bytes x head_dim) /
(1 byte x head_dim + 4 bytes) = 1.94x the bf16 tokens at head_dim 128.
"""
from dataclasses import dataclass

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
QMAX = {"int8": 127.0, "fp8": 448.0}
STORAGE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
MIN_SCALE = 1e-8


@dataclass
class LayerKVCache:
    """One attention layer's cache: values [num_blocks, block_size, num_kv_heads, head_dim] and, when
    quantized, scales [num_blocks, block_size, num_kv_heads]."""
    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def quantized(self) -> bool:
        return self.k_scale is not None


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
    """One contiguous tensor for all values (and one for all scales), viewed per layer."""
    values = torch.empty((2, num_layers, *shape), dtype=storage_dtype(kv_cache_dtype, model_dtype), device=device)
    if kv_cache_dtype == "auto":
        return [LayerKVCache(values[0, i], values[1, i]) for i in range(num_layers)]
    scales = torch.ones((2, num_layers, *shape[:-1]), dtype=torch.float32, device=device)
    return [LayerKVCache(values[0, i], values[1, i], scales[0, i], scales[1, i]) for i in range(num_layers)]
