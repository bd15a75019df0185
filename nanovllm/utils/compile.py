"""torch.compile for the small elementwise ops (SiLU-and-mul, plain RoPE, sampling math; the norms have
hand-written Triton kernels in layers/triton_norm.py).

Each op is a few PyTorch calls that would each be one kernel and one pass over memory; compiled, they
become one fused Triton kernel. Compilation only happens for CUDA tensors and when the engine allows it
(not with enforce_eager); on CPU the plain functions run, so tests stay fast and the references stay
the definition.
"""
import functools

import torch

_enabled = False


def set_compile_enabled(enabled: bool) -> None:
    global _enabled
    _enabled = enabled


def compile_on_cuda(fn):
    compiled = None

    @functools.wraps(fn)
    def wrapper(x: torch.Tensor, *args):
        nonlocal compiled
        if not (_enabled and x.is_cuda):
            return fn(x, *args)
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True)
        return compiled(x, *args)
    return wrapper
