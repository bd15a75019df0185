"""Qwen2/2.5, Llama 3.x and Mistral through the shared decoder, against transformers on tiny random models
(float32): greedy ids equal, first-step logits close, prefix caching and chunked prefill included."""
import pytest
import torch
from tiny_models import hf_greedy, hf_logits, make_tiny_arch

from nanovllm import LLM, SamplingParams
from nanovllm.engine.scheduler import ScheduledBatch
from nanovllm.engine.sequence import Sequence

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 500000.0}
CASES = {
    "qwen2": ("Qwen2ForCausalLM", {}),
    "llama3-bias-rope": ("LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True, rope_scaling=LLAMA3_ROPE)),
    "llama3.2-tied-head-dim": ("LlamaForCausalLM", dict(tie_word_embeddings=True, head_dim=32, rope_theta=500000.0)),
    "mistral": ("MistralForCausalLM", dict(sliding_window=None)),
    "qwen3-moe": ("Qwen3MoeForCausalLM", dict(head_dim=32, num_hidden_layers=3, moe_intermediate_size=32,
                                               num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                               decoder_sparse_step=1, mlp_only_layers=[1])),
}
PROMPTS = [[5, 9, 200, 31, 31, 7], [250, 3] * 20, [17], list(range(40, 110))]


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    arch, overrides = CASES[request.param]
    path = str(tmp_path_factory.mktemp(request.param))
    return path, make_tiny_arch(path, arch, **overrides)


def test_greedy_ids_equal_transformers(pair):
    path, hf = pair
    llm = LLM(path, kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256, max_num_seqs=16,
              max_num_batched_tokens=48)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)   # chunked prefill
    assert [o["token_ids"] for o in outs] == [hf_greedy(hf, p, 16) for p in PROMPTS]
    again = llm.generate(PROMPTS[3:], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
    assert again["num_cached_tokens"] > 0 and again["token_ids"] == outs[3]["token_ids"]     # prefix hit


def test_first_step_logits_close_to_transformers(pair):
    path, hf = pair
    llm = LLM(path, kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256, max_num_seqs=16)
    tables = {layer.self_attn.rotary_emb.cos_sin_cache.data_ptr() for layer in llm.model_runner.model.model.layers}
    assert len(tables) == 1                          # one RoPE table for all layers
    seqs = [Sequence(p) for p in PROMPTS]
    for seq in seqs:
        llm.scheduler.block_manager.allocate(seq)
    logits, _ = llm.model_runner.forward_logits(ScheduledBatch(seqs, [len(p) for p in PROMPTS]))
    for row, prompt in zip(logits, PROMPTS):
        torch.testing.assert_close(row.float().cpu(), hf_logits(hf, prompt), rtol=1e-4, atol=1e-4)


def test_a_sliding_window_is_refused_unless_it_covers_max_model_len(tmp_path):
    make_tiny_arch(str(tmp_path), "MistralForCausalLM", sliding_window=64)
    with pytest.raises(ValueError, match="sliding window of 64 tokens.*max_model_len=64"):
        LLM(str(tmp_path), max_model_len=256)
    assert LLM(str(tmp_path), max_model_len=64, num_kvcache_blocks=8, max_num_seqs=16).config.max_model_len == 64


def test_an_unknown_architecture_lists_the_supported_ones(tmp_path):
    import json
    make_tiny_arch(str(tmp_path), "LlamaForCausalLM")
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="supported: .*LlamaForCausalLM.*MistralForCausalLM"):
        LLM(str(tmp_path))


@pytest.mark.parametrize("case", ["qwen2", "llama3-bias-rope", "qwen3-moe"])
def test_tp2_equals_transformers(tmp_path, case):
    """Row-parallel biases (o_proj, down_proj) are added once, on rank 0; q/k/v biases are split; every
    rank holds a slice of every expert."""
    import multiprocessing
    arch, overrides = CASES[case]
    hf = make_tiny_arch(str(tmp_path), arch, **overrides)
    device = "cuda" if torch.cuda.device_count() >= 2 else "cpu"      # gloo on CPU where there is one GPU
    llm = LLM(str(tmp_path), kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256, max_num_seqs=16,
              tensor_parallel_size=2, device=device)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
        assert [o["token_ids"] for o in outs] == [hf_greedy(hf, p, 12) for p in PROMPTS]
    finally:
        llm.shutdown()
    assert multiprocessing.active_children() == []


def test_moe_reference_equals_a_per_token_loop():
    """fused_moe_ref (tokens grouped by expert) against the plain definition, token by token."""
    import torch.nn.functional as F

    from nanovllm.layers.moe import fused_moe_ref, select_experts
    torch.manual_seed(0)
    tokens, hidden, inter, experts, top_k = 37, 16, 8, 6, 3
    x = torch.randn(tokens, hidden)
    w13, w2 = torch.randn(experts, 2 * inter, hidden), torch.randn(experts, hidden, inter)
    weights, ids = select_experts(torch.randn(tokens, experts), top_k, renormalize=True)
    assert torch.allclose(weights.sum(-1), torch.ones(tokens))
    want = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for w, e in zip(weights[t], ids[t]):
            gate, up = (x[t] @ w13[e].t()).split(inter)
            want[t] += w * (F.silu(gate) * up) @ w2[e].t()
    torch.testing.assert_close(fused_moe_ref(x, w13, w2, weights, ids), want, rtol=1e-5, atol=1e-5)


def test_a_quantized_moe_checkpoint_is_refused(tmp_path):
    import json
    arch, overrides = CASES["qwen3-moe"]
    make_tiny_arch(str(tmp_path), arch, **overrides)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                                     "version": "gemm"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="mixture-of-experts"):
        LLM(str(tmp_path))


@pytest.mark.parametrize("rope_scaling", [None, LLAMA3_ROPE])
def test_rope_table_is_built_on_the_default_device(rope_scaling):
    """The runner builds the model under torch.set_default_device("cuda"); transformers' rope functions
    compute on the CPU. "meta" stands in for the GPU here: a table left on the CPU, or a CPU tensor mixed
    with a default-device one, fails as it did on the H100 for Llama 3.1."""
    from transformers import LlamaConfig

    from nanovllm.layers.rotary_embedding import RotaryEmbedding
    config = LlamaConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=128, rope_scaling=rope_scaling)
    with torch.device("meta"):
        rope = RotaryEmbedding(config, 32)
    assert rope.cos_sin_cache.device.type == "meta" and rope.cos_sin_cache.shape == (128, 32)
