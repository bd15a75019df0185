"""Rotary position embedding (NeoX half-rotation layout, as Qwen3 uses), from the model config.

For a head vector x split in halves (x1, x2) and angle theta_j = pos * inv_freq[j]:
    rotate(x) = (x1 cos - x2 sin, x2 cos + x1 sin)
cos/sin are precomputed for every position up to max_position_embeddings.
"""
import torch
from torch import nn

from nanovllm.layers.layernorm import rms_norm_ref
from nanovllm.utils.compile import compile_on_cuda


def rope_parameters(hf_config) -> dict:
    """{'rope_type': ..., 'rope_theta': ..., ...} from either transformers 5 or 4 config fields."""
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


def inv_frequencies(hf_config, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim // 2], attention scaling), computed on the CPU whatever the default
    device (transformers' rope functions are told "cpu"); RotaryEmbedding moves its table."""
    params = rope_parameters(hf_config)
    if params["rope_type"] == "dynamic":
        raise ValueError("rope_type 'dynamic' is not supported; use 'default', 'linear', 'yarn', 'llama3'")
    with torch.device("cpu"):
        if params["rope_type"] == "default":
            base = params["rope_theta"]
            return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim), 1.0
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_config, "cpu")
    return inv_freq.float(), float(scaling)


def apply_rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, num_heads, head_dim]; cos, sin [num_tokens, 1, head_dim // 2]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def qk_norm_rope_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, eps: float,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's per-head RMSNorm of q and k, then RoPE at `positions`."""
    cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)                 # [num_tokens, 1, head_dim/2]
    return (apply_rotary_ref(rms_norm_ref(q, q_weight, eps), cos, sin),
            apply_rotary_ref(rms_norm_ref(k, k_weight, eps), cos, sin))


@compile_on_cuda
def apply_rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
    return apply_rotary_ref(q, cos, sin), apply_rotary_ref(k, cos, sin)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k at the given positions."""

    def __init__(self, hf_config, head_dim: int):
        super().__init__()
        inv_freq, scaling = inv_frequencies(hf_config, head_dim)
        positions = torch.arange(hf_config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq.to(positions.device))   # [max_pos, head_dim // 2]
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1) * scaling
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """Rotate q and k (no qk-norm: Llama, Qwen2, Mistral); on CUDA one Triton launch for both."""
        head_dim = q.shape[-1]
        if q.is_cuda and head_dim & (head_dim - 1) == 0:   # the kernel's tiles need a power of 2
            from nanovllm.layers.triton_norm import qk_norm_rope
            return qk_norm_rope(q, k, positions, None, None, 0.0, self.cos_sin_cache)
        return apply_rotary(positions, q, k, self.cos_sin_cache)

    def forward_with_qk_norm(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_norm: nn.Module,
                             k_norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm each head of q and k (Qwen3's qk-norm), then rotate; on CUDA one fused Triton kernel."""
        assert q_norm.eps == k_norm.eps
        if q.is_cuda:
            from nanovllm.layers.triton_norm import qk_norm_rope
            return qk_norm_rope(q, k, positions, q_norm.weight, k_norm.weight, q_norm.eps, self.cos_sin_cache)
        return qk_norm_rope_ref(q, k, positions, q_norm.weight, k_norm.weight, q_norm.eps, self.cos_sin_cache)
