"""The dot precision the Triton kernels ask for, shared by the attention and AWQ kernels."""
import torch


def dot_precision(dtype: torch.dtype) -> str:
    """Triton kernels keep float32 models in true float32 (no TF32), so they agree with the references."""
    return "ieee" if dtype == torch.float32 else "tf32"
