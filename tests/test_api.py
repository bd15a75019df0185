"""The user-facing API: settings, bad input, stop conditions, seeds, chat, dtype."""
import json
import os
import random

import pytest
import torch
from tiny_models import make_tiny_model

from nanovllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("api"))
    make_tiny_model(path)
    return path


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model_dir, kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256)


def test_unknown_keyword_lists_valid_ones(model_dir):
    with pytest.raises(TypeError, match="max_num_seqs"):
        LLM(model_dir, max_num_seq=4)


@pytest.mark.parametrize("kw,match", [
    (dict(kvcache_block_size=10), "multiple of 16"),
    (dict(device="tpu"), "cuda"),
    (dict(load_format="pt"), "dummy"),
    (dict(dtype="int3"), "bfloat16"),
    (dict(attention_backend="xformers"), "triton"),
    (dict(kv_cache_dtype="int4"), "int8"),
    (dict(gpu_memory_utilization=1.5), r"\(0, 1\]"),
    (dict(tensor_parallel_size=3), "divide"),
    (dict(num_kvcache_blocks=1, max_model_len=256, kvcache_block_size=16), "max_model_len"),
])
def test_bad_settings_raise_value_error(model_dir, kw, match):
    with pytest.raises(ValueError, match=match):
        LLM(model_dir, **kw)


def test_more_gpus_than_visible_is_a_clear_error(model_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 needs that many GPUs, 1 visible"):
        LLM(model_dir, device="cuda", tensor_parallel_size=2)


def test_missing_model_dir_is_clear():
    with pytest.raises(ValueError, match="config.json"):
        LLM("/nonexistent/model")


def test_bad_requests_fail_alone(llm):
    good = [1, 2, 3]
    outs = llm.generate([[], good, [5, 99999], list(range(10)) * 30, good],
                        SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert [o["finish_reason"] for o in outs] == ["error", "length", "error", "error", "length"]
    assert "empty" in outs[0]["error"]
    assert "vocabulary" in outs[2]["error"] and "99999" in outs[2]["error"]
    assert "max_model_len" in outs[3]["error"]
    assert outs[1]["token_ids"] == outs[4]["token_ids"] and len(outs[1]["token_ids"]) == 4


def test_per_prompt_sampling_params_and_count_check(llm):
    outs = llm.generate([[1, 2], [3, 4]], [SamplingParams(temperature=0, max_tokens=2),
                                           SamplingParams(temperature=0, max_tokens=5)], use_tqdm=False)
    assert [len(o["token_ids"]) for o in outs] == [2, 5]
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate([[1], [2]], [SamplingParams()] * 3, use_tqdm=False)


def test_string_prompts_are_tokenized_and_text_detokenized(llm):
    out = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0]
    assert out["prompt_token_ids"] == list(b"hello")
    assert out["text"] == llm.tokenizer.decode(out["token_ids"], skip_special_tokens=True)


def test_stop_token_ids_and_eos(llm):
    ref = llm.generate([[7, 8, 9]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                       use_tqdm=False)[0]["token_ids"]
    stop_at = ref[5]
    out = llm.generate([[7, 8, 9]], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at]),
                       use_tqdm=False)[0]
    assert out["finish_reason"] == "stop" and out["token_ids"] == ref[:ref.index(stop_at) + 1]


def test_stop_strings_are_cut_from_text(llm):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    full = llm.generate([[7, 8, 9]], params, use_tqdm=False)[0]
    text = full["text"]
    stop = text[6:8] if len(text) >= 8 else text[-1]
    out = llm.generate([[7, 8, 9]], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]),
                       use_tqdm=False)[0]
    assert out["finish_reason"] == "stop"
    assert out["text"] == text[:text.find(stop)] and stop not in out["text"]


def test_eos_ids_come_from_generation_config(tmp_path):
    make_tiny_model(str(tmp_path))
    with open(tmp_path / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": [256, 258]}, f)
    llm = LLM(str(tmp_path), kvcache_block_size=16, num_kvcache_blocks=32, max_model_len=128)
    assert {256, 258} <= llm.eos_token_ids


def test_seed_reproduces_whatever_else_is_in_the_batch(llm):
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=42, ignore_eos=True)
    alone = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0]["token_ids"]
    rng = random.Random(0)
    others = [[rng.randrange(256) for _ in range(rng.randrange(1, 40))] for _ in range(5)]
    batch = llm.generate(others[:2] + [[1, 2, 3]] + others[2:],
                         [SamplingParams(temperature=1.0, max_tokens=20)] * 2 + [params] +
                         [SamplingParams(temperature=0.8, max_tokens=7)] * 3, use_tqdm=False)
    assert batch[2]["token_ids"] == alone
    other_seed = llm.generate([[1, 2, 3]], SamplingParams(temperature=1.0, max_tokens=16, seed=7,
                                                          ignore_eos=True), use_tqdm=False)[0]["token_ids"]
    assert other_seed != alone


def test_chat_applies_template(llm):
    messages = [{"role": "user", "content": "hi"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
    prompt = llm.tokenizer.decode(out["prompt_token_ids"])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert len(llm.chat([messages, messages], SamplingParams(max_tokens=2), use_tqdm=False)) == 2


def test_dtype_auto_follows_checkpoint(tmp_path):
    make_tiny_model(str(tmp_path), dtype=torch.bfloat16)
    llm = LLM(str(tmp_path), kvcache_block_size=16, num_kvcache_blocks=32, max_model_len=128)
    assert llm.config.dtype == torch.bfloat16
    assert llm.model_runner.model.lm_head.weight.dtype == torch.bfloat16
    assert llm.model_runner.kv_caches[0].k.dtype == torch.bfloat16
    forced = LLM(str(tmp_path), dtype="float32", kvcache_block_size=16, num_kvcache_blocks=32, max_model_len=128)
    assert forced.model_runner.model.lm_head.weight.dtype == torch.float32


def test_cpu_cache_size_comes_from_setting(model_dir):
    llm = LLM(model_dir, kvcache_block_size=16, cpu_kvcache_space_gib=0.001, max_model_len=128)
    assert llm.model_runner.num_kvcache_blocks == int(0.001 * 2**30) // llm.model_runner.block_bytes()


def test_dummy_load_format_runs_without_weights(tmp_path):
    make_tiny_model(str(tmp_path))
    for f in os.listdir(tmp_path):
        if f.endswith(".safetensors"):
            os.remove(tmp_path / f)
    llm = LLM(str(tmp_path), load_format="dummy", kvcache_block_size=16, num_kvcache_blocks=32, max_model_len=128)
    out = llm.generate([[1, 2]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
    assert len(out["token_ids"]) == 3
