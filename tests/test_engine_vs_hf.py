"""End to end against Hugging Face transformers: same weights, greedy token ids equal, logits close."""
import random

import pytest
import torch
from tiny_models import hf_greedy, hf_logits, make_tiny_model

from nanovllm import LLM, SamplingParams
from nanovllm.engine.scheduler import ScheduledBatch
from nanovllm.engine.sequence import Sequence

CONFIGS = {
    "mha-hd64": dict(num_heads=4, num_kv_heads=4, head_dim=64),
    "gqa2-hd128-tied": dict(num_heads=4, num_kv_heads=2, head_dim=128, tie=True),
    "gqa4-hd64": dict(num_heads=8, num_kv_heads=2, head_dim=64),
    "gqa4-hd128-tied": dict(num_heads=4, num_kv_heads=1, head_dim=128, tie=True),
}
LENGTHS = [1, 7, 16, 33, 70]
MAX_TOKENS = 24


def prompts(lengths=LENGTHS, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module", params=list(CONFIGS))
def model_pair(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    hf = make_tiny_model(path, **CONFIGS[request.param])
    return path, hf


def llm_for(path, **kw):
    kw = dict(kvcache_block_size=16, num_kvcache_blocks=128, max_model_len=512) | kw
    return LLM(path, **kw)


def greedy(llm, ps, max_tokens=MAX_TOKENS):
    return llm.generate(ps, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)


def test_greedy_tokens_equal_hf(model_pair):
    path, hf = model_pair
    ps = prompts()
    outs = greedy(llm_for(path), ps)
    for p, out in zip(ps, outs):
        assert out["token_ids"] == hf_greedy(hf, p, MAX_TOKENS)
        assert out["prompt_token_ids"] == p


def test_first_step_logits_close_to_hf(model_pair):
    path, hf = model_pair
    llm = llm_for(path)
    ps = prompts()
    seqs = [Sequence(p) for p in ps]
    for seq in seqs:
        llm.scheduler.block_manager.allocate(seq)
    logits, rows = llm.model_runner.forward_logits(ScheduledBatch(seqs, [len(p) for p in ps]))
    assert rows == list(range(len(ps)))
    for p, got in zip(ps, logits):
        torch.testing.assert_close(got.float(), hf_logits(hf, p), atol=2e-4, rtol=2e-4)


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gqa"))
    hf = make_tiny_model(path, num_heads=4, num_kv_heads=2, head_dim=32)
    return path, hf


def expected(hf, ps, max_tokens=MAX_TOKENS):
    return [hf_greedy(hf, p, max_tokens) for p in ps]


def test_prefix_cache_hits_give_same_tokens(gqa_model):
    path, hf = gqa_model
    llm = llm_for(path)
    base = prompts([40])[0]
    ps = [base + [5, 6, 7], base[:32], base + [9] * 20, base[:16] + [1, 2]]
    want = expected(hf, ps)
    first = greedy(llm, ps)
    second = greedy(llm, ps)
    assert [o["token_ids"] for o in first] == want
    assert [o["token_ids"] for o in second] == want
    assert all(o["num_cached_tokens"] > 0 for o in second)       # every prompt hit the cache
    assert second[1]["num_cached_tokens"] == 16                  # 32 tokens, fully cached: last block recomputed


def test_chunked_prefill_gives_same_tokens(gqa_model):
    path, hf = gqa_model
    ps = prompts([5, 40, 70, 33], seed=1)
    outs = greedy(llm_for(path, max_num_batched_tokens=16, enable_prefix_caching=False), ps)
    assert [o["token_ids"] for o in outs] == expected(hf, ps)


def test_chunk_attends_to_exactly_the_tokens_written(gqa_model):
    path, _ = gqa_model
    llm = llm_for(path, max_num_batched_tokens=16)
    seq = Sequence(prompts([40])[0])
    llm.scheduler.add(seq)
    batch = llm.scheduler.schedule()
    llm.scheduler.postprocess(batch, llm.model_runner.run(batch)[0])
    batch = llm.scheduler.schedule()                              # second chunk: tokens 16..31
    _, positions, meta, rows = llm.model_runner.prepare(batch)
    assert positions.tolist() == list(range(16, 32))
    assert meta.context_lens_cpu == [32] and rows == []
    slots = meta.slot_mapping.tolist()
    assert slots == [seq.block_table[1] * 16 + i for i in range(16)]


def test_preemption_gives_same_tokens(gqa_model):
    path, hf = gqa_model
    ps = prompts([30, 41, 25, 50, 12, 36], seed=2)
    llm = llm_for(path, num_kvcache_blocks=10, max_model_len=128)
    outs = greedy(llm, ps, max_tokens=40)
    assert llm.scheduler.num_preemptions > 0
    assert [o["token_ids"] for o in outs] == expected(hf, ps, 40)


def test_decode_position_is_last_token(gqa_model):
    path, _ = gqa_model
    llm = llm_for(path)
    seq = Sequence(prompts([20])[0])
    llm.scheduler.add(seq)
    batch = llm.scheduler.schedule()
    llm.scheduler.postprocess(batch, llm.model_runner.run(batch)[0])
    batch = llm.scheduler.schedule()
    assert not batch.is_prefill
    ids, positions, meta, _ = llm.model_runner.prepare(batch)
    assert positions.tolist() == [len(seq) - 1] and ids.tolist() == [seq.token_ids[-1]]
    assert meta.context_lens_cpu == [len(seq)]
