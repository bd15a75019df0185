"""INT8/FP8 KV caches on CPU: capacity, agreement with the model-dtype cache, and the same engine features."""
import pytest
import torch
from tiny_models import make_tiny_model

from benchmarks.verify_kv_quant import compare, demo_prompts, teacher_forced_logprobs
from nanovllm import LLM, SamplingParams
from nanovllm.demo import DEMO_MODEL_DIR

# CPU engines even where a GPU exists: several engines live at once here, and on a GPU each would claim
# gpu_memory_utilization of the card (the GPU path is covered by tests/test_gpu.py and tests/kernels)
KW = dict(max_model_len=512, kvcache_block_size=16, device="cpu")


@pytest.fixture(scope="module")
def demo_pair():
    return LLM(DEMO_MODEL_DIR, **KW), LLM(DEMO_MODEL_DIR, kv_cache_dtype="int8", **KW)


def test_int8_top1_agreement_on_demo_model(demo_pair):
    ref, quant = demo_pair
    result = compare(ref, quant, demo_prompts(ref, 6), max_tokens=60)
    assert result["teacher_forced_top1_agreement"] >= 0.99
    assert result["greedy_token_agreement"] >= 0.95
    assert result["teacher_forced_mean_kl"] < 0.01


def test_teacher_forced_logprobs_match_prompt_logprobs(demo_pair):
    ref, _ = demo_pair
    ids = ref.tokenizer.encode("Beautiful is better than ugly.")
    lp = teacher_forced_logprobs(ref, ids)
    out = ref.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    for p in range(1, len(ids)):
        assert out["prompt_logprobs"][p][ids[p]] == pytest.approx(lp[p - 1, ids[p]].item(), abs=1e-3)


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_quantized_cache_capacity_and_dtype(tmp_path, kv_dtype):
    make_tiny_model(str(tmp_path), head_dim=128, dtype=torch.bfloat16)
    ref = LLM(str(tmp_path), cpu_kvcache_space_gib=0.01, **KW)
    quant = LLM(str(tmp_path), cpu_kvcache_space_gib=0.01, kv_cache_dtype=kv_dtype, **KW)
    assert quant.model_runner.num_kvcache_blocks >= 1.9 * ref.model_runner.num_kvcache_blocks
    cache = quant.model_runner.kv_caches[0]
    assert cache.k.dtype == (torch.int8 if kv_dtype == "int8" else torch.float8_e4m3fn)
    assert cache.k_scale.dtype == torch.float32
    out = quant.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0]
    assert len(out["token_ids"]) == 5


def test_int8_with_prefix_cache_chunks_and_preemption(tmp_path):
    """The quantized cache changes nothing in the engine's bookkeeping: same tokens with or without
    prefix hits, chunking and preemption (all with int8)."""
    make_tiny_model(str(tmp_path))
    ps = [[i % 250 for i in range(n, 3 * n)] for n in (10, 25, 40, 33)]
    params = SamplingParams(temperature=0, max_tokens=30)
    base = LLM(str(tmp_path), kv_cache_dtype="int8", num_kvcache_blocks=128, enable_prefix_caching=False, **KW)
    want = [o["token_ids"] for o in base.generate(ps, params, use_tqdm=False)]
    for kw in (dict(num_kvcache_blocks=128), dict(num_kvcache_blocks=128, max_num_batched_tokens=16),
               dict(num_kvcache_blocks=12, max_num_seqs=4, max_model_len=160)):
        llm = LLM(str(tmp_path), kv_cache_dtype="int8", **(KW | kw))
        for _ in range(2):
            assert [o["token_ids"] for o in llm.generate(ps, params, use_tqdm=False)] == want
        assert llm.scheduler.num_preemptions > 0 or kw["num_kvcache_blocks"] == 128


def test_flash_attn_backend_rejects_quantized_cache(tmp_path):
    pytest.importorskip("flash_attn")
    make_tiny_model(str(tmp_path))
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(str(tmp_path), kv_cache_dtype="int8", attention_backend="flash_attn", **KW)
