"""KV cache dtypes: the model's dtype, or INT8 / FP8 (e4m3) with a scale per token and KV head.

Quantization of one head vector x (head_dim values) when it is written to the cache:
    scale = max|x| / QMAX          (QMAX = 127 for int8, 448 for fp8 e4m3; a zero vector gets a tiny scale)
    q     = round(x / scale)       (int8, half away from zero, within [-127, 127])   or   fp8(x / scale)
and when attention reads it:  x' = q * scale, in float32, then the model's dtype.
Per token and per head, because K/V outliers sit in a few heads and tokens: one scale per head vector keeps
each vector's full range. Scales are float32 in tensors beside the cache, addressed by block and row exactly
like the values: `LayerKVCache.k_scale` is [num_blocks, block_size, num_kv_heads]. Capacity:
(2 bytes x head_dim) / (1 byte x head_dim + 4 bytes) = 1.94x the bf16 tokens at head_dim 128.

Two layouts serve the attention kernels, which read one KV head's keys a tile at a time:
- Scales are stored head-major within each block, [num_blocks, num_kv_heads, block_size] (k_scale views it
  as above), so one tile's scales are one contiguous run. Token-major, a key's scale shares its 32-byte
  memory sector with the other heads' scales and a tile's scale loads move 8x the bytes they use (at 8 KV
  heads): Nsight Compute counted 17% of the decode kernel's memory sectors as that excess.
- V is stored transposed in groups of G = v_key_group(block_size) keys (64, or fewer when the block size
  is not a multiple of 64), [num_blocks, num_kv_heads, block_size // G, head_dim, G]: the 8-bit
  tensor-core dot P @ V wants each dimension's keys side by side, so the kernels load V tiles straight
  into that operand layout with 16-byte loads instead of gathering bytes (a third of the decode loop's
  instructions). Groups rather than whole blocks (vLLM's original V layout, [.., head_dim, block_size])
  keep a token's values G bytes apart instead of block_size, so storing a token touches fewer cache lines.
  Groups of 16 halve that again, but the decode kernel then ran slower (likely because a warp's 16-byte
  loads of a tile then spread over twice the cache lines; docs/features/int8_kv_cache).
  `LayerKVCache.v_groups` views V per slot.
A quantized cache starts zeroed and the store writes no NaN, so any bytes of an allocated block can be
read and multiplied by a zero probability (the kernels skip masking V inside a block).
"""
import math
from dataclasses import dataclass

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
QMAX = {"int8": 127.0, "fp8": 448.0}
STORAGE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
MIN_SCALE = 1e-8
V_KEY_GROUP = 64   # keys stored side by side per dimension in a quantized V, at most


def v_key_group(block_size: int) -> int:
    """Keys side by side per dimension in a quantized V: 64, or the largest power of 2 dividing block_size."""
    return math.gcd(V_KEY_GROUP, block_size)


@dataclass
class LayerKVCache:
    """One attention layer's cache: K [num_blocks, block_size, num_kv_heads, head_dim]; V the same, or
    [num_blocks, num_kv_heads, block_size // G, head_dim, G] when quantized (G = v_key_group(block_size));
    and, when quantized, scales [num_blocks, block_size, num_kv_heads], views of head-major storage."""
    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def quantized(self) -> bool:
        return self.k_scale is not None

    @property
    def v_groups(self) -> torch.Tensor:
        """V as [num_blocks, block_size // G, G, num_kv_heads, head_dim], G = v_key_group(block_size), whatever
        its storage (a view: slot s of block b is [b, s // G, s % G])."""
        if self.quantized:
            return self.v.permute(0, 2, 4, 1, 3)
        return self.v.unflatten(1, (-1, v_key_group(self.v.shape[1])))

    @property
    def v_group(self) -> int:
        """Keys stored side by side per dimension in V: G when quantized, 0 when V is stored per slot."""
        return self.v.shape[-1] if self.quantized else 0

    def check_storage(self) -> None:
        """The storage the Triton kernels address directly: K and V contiguous, scales head-major."""
        _, block_size, num_kv_heads, _ = self.k.shape
        assert self.k.is_contiguous() and self.v.is_contiguous() and self.v.numel() == self.k.numel()
        if self.quantized:
            head_major_strides = (num_kv_heads * block_size, 1, block_size)
            assert self.k_scale.stride() == head_major_strides and self.v_scale.stride() == head_major_strides

    @property
    def v_slots(self) -> torch.Tensor:
        """V as [num_blocks, block_size, num_kv_heads, head_dim] (a copy when quantized: write through
        v_groups)."""
        return self.v_groups.flatten(1, 2)


def quantized_cache(k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor) -> LayerKVCache:
    """A quantized cache from values k, v [num_blocks, block_size, num_kv_heads, head_dim] and their scales
    [num_blocks, block_size, num_kv_heads], V and the scales copied into their storage layouts."""
    # [blocks, heads, groups, dim, keys]
    grouped = v.unflatten(1, (-1, v_key_group(v.shape[1]))).permute(0, 3, 1, 4, 2)
    return LayerKVCache(k, grouped.contiguous(), head_major(k_scale), head_major(v_scale))


def head_major(scales: torch.Tensor) -> torch.Tensor:
    """scales [num_blocks, block_size, num_kv_heads] copied into head-major storage, viewed the same way."""
    return scales.transpose(1, 2).contiguous().transpose(1, 2)


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
    [num_blocks, block_size, num_kv_heads, head_dim]; a quantized V is viewed grouped within its blocks
    and the scales head-major."""
    dtype = storage_dtype(kv_cache_dtype, model_dtype)
    if kv_cache_dtype == "auto":
        values = torch.empty((2, num_layers, *shape), dtype=dtype, device=device)
        return [LayerKVCache(values[0, i], values[1, i]) for i in range(num_layers)]
    num_blocks, block_size, num_kv_heads, head_dim = shape
    values = torch.zeros((2, num_layers, *shape), dtype=dtype, device=device)   # zeroed: no NaN bytes anywhere
    scales = torch.ones((2, num_layers, num_blocks, num_kv_heads, block_size), dtype=torch.float32, device=device)
    group = v_key_group(block_size)
    grouped_v = (num_blocks, num_kv_heads, block_size // group, head_dim, group)
    return [LayerKVCache(values[0, i], values[1, i].view(grouped_v), scales[0, i].transpose(1, 2),
                         scales[1, i].transpose(1, 2)) for i in range(num_layers)]
