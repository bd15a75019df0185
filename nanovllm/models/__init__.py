"""Architectures by the name config.json gives in `architectures`."""
from nanovllm.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY = {"Qwen3ForCausalLM": Qwen3ForCausalLM}


def get_model_class(hf_config):
    names = getattr(hf_config, "architectures", None) or ["Qwen3ForCausalLM"]
    for name in names:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise ValueError(f"architectures {names} are not supported; supported: {list(MODEL_REGISTRY)}")
