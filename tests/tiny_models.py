"""Tiny random Qwen3 checkpoints built with transformers: the oracle's weights are ours too."""
import os

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from nanovllm.demo.byte_tokenizer import save_byte_tokenizer

VOCAB = 320   # 259 tokenizer entries, padded like real checkpoints pad theirs


def tiny_config(num_heads=4, num_kv_heads=2, head_dim=32, tie=False, layers=2, hidden=64, **overrides):
    cfg = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
               max_position_embeddings=1024, tie_word_embeddings=tie, rms_norm_eps=1e-6,
               initializer_range=0.2, eos_token_id=256, bos_token_id=256, pad_token_id=256)
    cfg.update(overrides)
    return Qwen3Config(**cfg)


def make_tiny_model(out_dir: str, seed: int = 0, dtype=torch.float32, **config_kwargs) -> Qwen3ForCausalLM:
    """Save a random tiny Qwen3 (safetensors + byte tokenizer) to out_dir and return the HF model."""
    torch.manual_seed(seed)
    config = tiny_config(**config_kwargs)
    model = Qwen3ForCausalLM(config).to(dtype).eval()
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_byte_tokenizer(out_dir)
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """HF generate(do_sample=False) for one prompt, generated ids only (stops at EOS like the engine)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=256)
    return out[0, len(prompt):].tolist()


def hf_logits(model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0, -1].float()


def make_tiny_arch(out_dir: str, arch: str, seed: int = 0, **overrides):
    """A tiny random model of another architecture of the decoder family (float32), saved like
    make_tiny_model; overrides go to its config (e.g. attention_bias, mlp_bias, rope_scaling)."""
    import transformers
    config_class = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=0.2,
               eos_token_id=256, bos_token_id=256, pad_token_id=256, tie_word_embeddings=False)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config_class(**cfg)).float().eval()
    with torch.no_grad():      # biases start at zero in transformers: give them values a wrong load would show
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_byte_tokenizer(out_dir)
    return model
