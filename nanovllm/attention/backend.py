"""Choosing an attention backend by name; backends are imported only when chosen."""
import importlib
import importlib.util

_BACKENDS = {
    "torch": ("nanovllm.attention.torch_ref", "TorchBackend"),
    "triton": ("nanovllm.attention.triton_backend", "TritonBackend"),
    "flash_attn": ("nanovllm.attention.flash_attn_backend", "FlashAttnBackend"),
}


def resolve_backend_name(name: str, device: str) -> str:
    """'auto': flash_attn when installed on CUDA, else triton on CUDA, else the torch reference."""
    if name != "auto":
        if name != "torch" and device != "cuda":
            raise ValueError(f"attention_backend={name!r} needs a CUDA device; on {device} use 'torch' or 'auto'")
        return name
    if device != "cuda":
        return "torch"
    return "flash_attn" if importlib.util.find_spec("flash_attn") else "triton"


def get_attention_backend(name: str, device: str):
    name = resolve_backend_name(name, device)
    if name not in _BACKENDS:
        raise ValueError(f"attention_backend={name!r} is not available; choose one of {['auto', *_BACKENDS]}")
    module, cls = _BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
