"""Architectures by the name config.json gives in `architectures`: each is the shared decoder (decoder.py)
with the ArchSpec that says how it differs."""
from nanovllm.models.decoder import ArchSpec, DecoderForCausalLM

ARCHITECTURES = {
    "Qwen3ForCausalLM": ArchSpec(qk_norm=True, qkv_bias="attention_bias", o_bias="attention_bias"),
    "Qwen2ForCausalLM": ArchSpec(qkv_bias=True),                       # Qwen2 and Qwen2.5
    "LlamaForCausalLM": ArchSpec(qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias="mlp_bias"),
    "MistralForCausalLM": ArchSpec(),
    "Qwen3MoeForCausalLM": ArchSpec(qk_norm=True, moe=True, qkv_bias="attention_bias", o_bias="attention_bias"),
}
MODEL_REGISTRY = {name: type(name, (DecoderForCausalLM,), {"spec": spec}) for name, spec in ARCHITECTURES.items()}


def get_model_class(hf_config):
    names = getattr(hf_config, "architectures", None) or ["Qwen3ForCausalLM"]
    for name in names:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise ValueError(f"architectures {names} are not supported; supported: {list(MODEL_REGISTRY)}")


def sliding_window(hf_config) -> int | None:
    """The attention window the config asks for, or None (Qwen2/3 name it but switch it off by default)."""
    if getattr(hf_config, "use_sliding_window", True) is False:
        return None
    return getattr(hf_config, "sliding_window", None)


def check_architecture(hf_config, max_model_len: int) -> None:
    """ValueError for a config the shared decoder would not run exactly as transformers does."""
    get_model_class(hf_config)
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported; the decoder's MLP is SwiGLU ('silu')")
    if ARCHITECTURES[get_model_class(hf_config).__name__].moe and getattr(hf_config, "quantization_config", None):
        raise ValueError("quantized (AWQ) checkpoints of mixture-of-experts models are not supported yet; use the "
                         "bf16 checkpoint")
    window = sliding_window(hf_config)
    if window is not None and window < max_model_len:
        raise ValueError(f"this model attends within a sliding window of {window} tokens, which nanovllm's "
                         f"attention kernels do not apply; with max_model_len <= {window} every token sees its "
                         f"whole context and the window changes nothing: pass max_model_len={window}")
