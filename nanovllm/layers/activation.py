"""SwiGLU's gate: silu(gate) * up on a tensor that holds [gate | up] along the last dim."""
import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.utils.compile import compile_on_cuda


@compile_on_cuda
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)
