"""RMSNorm, optionally fused with the residual add that precedes it."""
import torch
from torch import nn


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = w * x / sqrt(mean(x^2) + eps), statistics in float32 (as Hugging Face computes it)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """norm(x), or (norm(x + residual), x + residual) with the sum rounded to x's dtype."""
    if residual is None:
        return rms_norm_ref(x, weight, eps)
    x = x + residual
    return rms_norm_ref(x, weight, eps), x


class RMSNorm(nn.Module):
    """forward(x) -> norm(x); forward(x, residual) -> (norm(x + residual), x + residual).
    On CUDA one fused Triton kernel (triton_norm.py) does the add and the norm."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.is_cuda and x.dim() == 2:
            from nanovllm.layers.triton_norm import add_rms_norm
            return add_rms_norm(x, residual, self.weight, self.eps)
        return add_rms_norm_ref(x, residual, self.weight, self.eps)
