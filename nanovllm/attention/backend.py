"""Choosing an attention backend by name; backends are imported only when chosen."""
import importlib

_BACKENDS = {
    "torch": ("nanovllm.attention.torch_ref", "TorchBackend"),
}


def available_backends() -> list[str]:
    return list(_BACKENDS)


def get_attention_backend(name: str, device: str):
    """'auto' is the fastest backend that runs on `device`."""
    if name == "auto":
        name = "torch"
    if name not in _BACKENDS:
        raise ValueError(f"attention_backend={name!r} is not available; choose one of "
                         f"{['auto', *_BACKENDS]}")
    module, cls = _BACKENDS[name]
    return getattr(importlib.import_module(module), cls)()
