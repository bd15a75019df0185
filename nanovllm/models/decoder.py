"""The Llama-family decoder that Qwen3, Qwen2/2.5, Llama 3.x and Mistral share: pre-norm layers of GQA
attention with RoPE and a SwiGLU MLP, RMSNorm, an LM head (tied to the embedding or not).

What differs between the architectures is one `ArchSpec` each (models/__init__.py), read here:
- qk_norm: Qwen3 RMSNorms each head of q and k before RoPE;
- qkv_bias / o_bias / mlp_bias: True, False, or the name of the config field that says (Llama's
  `attention_bias` and `mlp_bias`; Qwen2 always has q/k/v biases and no o_proj bias);
- RoPE variants (Llama 3's `rope_scaling`) come from the config through layers/rotary_embedding.py;
- moe: Qwen3-MoE's sparse layers (every `decoder_sparse_step`-th, except `mlp_only_layers`) route each
  token to `num_experts_per_tok` of `num_experts` experts (layers/moe.py).
Inputs are flat: all tokens of all sequences of a step in one [num_tokens] batch; the attention layers
find sequence boundaries and the paged KV cache through the step's metadata.
"""
import re
from dataclasses import dataclass

import torch
from torch import nn

from nanovllm.layers.activation import SiluAndMul
from nanovllm.layers.attention import Attention
from nanovllm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from nanovllm.layers.moe import FusedMoE
from nanovllm.layers.rotary_embedding import RotaryEmbedding


@dataclass(frozen=True)
class ArchSpec:
    """What one architecture does differently; a str names the config field that decides (default False)."""
    qk_norm: bool = False
    moe: bool = False
    qkv_bias: bool | str = False
    o_bias: bool | str = False
    mlp_bias: bool | str = False

    def flag(self, name: str, config) -> bool:
        value = getattr(self, name)
        return bool(getattr(config, value, False)) if isinstance(value, str) else value


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class DecoderAttention(nn.Module):
    def __init__(self, config, spec: ArchSpec, quant_config, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.head_dim = head_dim_of(config)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, config.num_attention_heads,
                                          config.num_key_value_heads, spec.flag("qkv_bias", config),
                                          quant_method=quant_config and quant_config.method_for("qkv_proj"))
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim, config.hidden_size,
                                        spec.flag("o_bias", config),
                                        quant_method=quant_config and quant_config.method_for("o_proj"))
        self.rotary_emb = rotary_emb          # shared by every layer (DecoderModel)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim ** -0.5)
        self.q_norm = self.k_norm = None
        if spec.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)                      # [num_tokens, heads, head_dim]
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.rotary_emb.forward_with_qk_norm(positions, q, k, self.q_norm, self.k_norm)
        else:
            q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class DecoderMLP(nn.Module):
    def __init__(self, config, spec: ArchSpec, quant_config=None):
        super().__init__()
        bias = spec.flag("mlp_bias", config)
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias,
            quant_method=quant_config and quant_config.method_for("gate_up_proj"))
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias,
                                           quant_method=quant_config and quant_config.method_for("down_proj"))
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        fused = self.down_proj.forward_silu_and_mul(gate_up)     # the activation inside down's kernel, if it can
        return fused if fused is not None else self.down_proj(self.act_fn(gate_up))


class SparseMoeBlock(nn.Module):
    """Qwen3-MoE's MLP: the router (`gate`, replicated on every rank) and the experts."""

    def __init__(self, config):
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = FusedMoE(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                                config.moe_intermediate_size, bool(getattr(config, "norm_topk_prob", True)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))


def is_sparse_layer(config, index: int) -> bool:
    """Qwen3-MoE: every decoder_sparse_step-th layer has experts, except the mlp_only_layers."""
    step = getattr(config, "decoder_sparse_step", 1)
    return (index not in (getattr(config, "mlp_only_layers", None) or []) and config.num_experts > 0
            and (index + 1) % step == 0)


class DecoderLayer(nn.Module):
    def __init__(self, config, spec: ArchSpec, quant_config, index: int, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.self_attn = DecoderAttention(config, spec, quant_config, rotary_emb)
        if spec.moe and is_sparse_layer(config, index):
            self.mlp = SparseMoeBlock(config)
        else:
            self.mlp = DecoderMLP(config, spec, quant_config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class DecoderModel(nn.Module):
    def __init__(self, config, spec: ArchSpec, quant_config=None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        # one cos/sin table for all layers: [max_position_embeddings, head_dim] float32 is 64 MB for Llama 3.1's
        # 131,072 positions, which a table per layer would take 32 times from the KV cache
        rotary_emb = RotaryEmbedding(config, head_dim_of(config))
        self.layers = nn.ModuleList([DecoderLayer(config, spec, quant_config, i, rotary_emb)
                                     for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


EXPERT_TENSOR = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


class DecoderForCausalLM(nn.Module):
    """Checkpoint tensors q/k/v_proj and gate/up_proj load into the packed qkv_proj and gate_up_proj.
    Subclasses (models/__init__.py) set `spec`."""
    spec = ArchSpec()

    supports_cuda_graphs = True     # MoE layers too: on CUDA their routing stays on the device (triton_moe.py)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config, quant_config=None):
        super().__init__()
        self.model = DecoderModel(config, self.spec, quant_config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    @staticmethod
    def checkpoint_target(name: str) -> tuple[str, tuple[str, int]] | None:
        """An expert's tensor (`...mlp.experts.<e>.gate_proj.weight`) -> (the stacked parameter, (kind, e))."""
        match = EXPERT_TENSOR.match(name)
        if match is None:
            return None
        prefix, expert, kind = match.groups()
        return f"{prefix}.{'w2' if kind == 'down' else 'w13'}_weight", (kind, int(expert))

    def untie_word_embeddings(self) -> None:
        """Give the LM head a weight of its own (the loader calls this when a checkpoint whose config ties
        the embeddings still holds lm_head.weight: transformers then keeps the two apart, and so do we)."""
        head = self.lm_head
        head.weight = nn.Parameter(torch.empty_like(head.weight), requires_grad=False)
        head.weight.weight_loader = head.weight_loader
        self.tie_word_embeddings = False

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)
