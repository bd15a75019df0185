"""Mixed steps (decodes and prefill chunks under one token budget) give every request the greedy tokens
transformers gives it alone, over random schedules: tiny budgets that cut prompts into chunks beside the
decodes, caches small enough to force preemption, shared prefixes that hit the prefix cache, many more
requests than seats, logprobs on. CPU, tiny float32 model, the torch attention backend."""
import math
import random

import pytest
from tiny_models import hf_greedy, make_tiny_model

from nanovllm import LLM, SamplingParams

SCHEDULES = {   # name: (LLM settings, number of requests)
    "budget3-seats4": (dict(max_num_batched_tokens=3, max_num_seqs=4, num_kvcache_blocks=64), 10),
    "budget17-seats3-preempt": (dict(max_num_batched_tokens=17, max_num_seqs=3, num_kvcache_blocks=9), 14),
    "budget40-seats6-preempt": (dict(max_num_batched_tokens=40, max_num_seqs=6, num_kvcache_blocks=12), 24),
    "budget64-seats2": (dict(max_num_batched_tokens=64, max_num_seqs=2, num_kvcache_blocks=64), 12),
    # admission in waves: newcomers only once 3 of the 5 seats are free (Scheduler.admit_min_free_seats)
    "budget17-seats5-waves": (dict(max_num_batched_tokens=17, max_num_seqs=5, num_kvcache_blocks=64,
                                   admit_min_free_seats=3), 12),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mixed"))
    return path, make_tiny_model(path, num_heads=4, num_kv_heads=2, head_dim=32)


def requests(seed: int, n: int):
    """Prompts of 1-60 tokens, a third of them behind one of two shared 32-token prefixes (two blocks),
    and per-request max_tokens; odd requests ask for logprobs."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(250) for _ in range(32)] for _ in range(2)]
    prompts, params = [], []
    for i in range(n):
        own = [rng.randrange(250) for _ in range(rng.randrange(1, 30))]
        prompts.append(prefixes[i % 2] + own if i % 3 == 0 else own + [rng.randrange(250)] * rng.randrange(0, 30))
        params.append(SamplingParams(temperature=0, max_tokens=rng.randrange(1, 20), ignore_eos=True,
                                     logprobs=2 if i % 2 else None))
    return prompts, params


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_mixed_steps_give_each_request_its_own_greedy_tokens(model, name):
    path, hf = model
    settings, n = SCHEDULES[name]
    settings = dict(settings)
    waves = settings.pop("admit_min_free_seats", 1)
    prompts, params = requests(seed=len(name), n=n)
    llm = LLM(path, kvcache_block_size=16, max_model_len=128, **settings)
    llm.scheduler.admit_min_free_seats = waves
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.stats
    assert stats["mixed_steps"] > 0, stats                    # the schedule did mix decodes and chunks
    if "preempt" in name:
        assert llm.scheduler.num_preemptions > 0
    if settings["num_kvcache_blocks"] == 64:
        assert any(o["num_cached_tokens"] > 0 for o in outs)  # a shared prefix came from the cache
    for prompt, p, out in zip(prompts, params, outs):
        assert out["token_ids"] == hf_greedy(hf, prompt, p.max_tokens), out
        if p.logprobs is not None:
            assert len(out["logprobs"]) == len(out["token_ids"])
            assert all(t in d and d[t] <= 0 for d, t in zip(out["logprobs"], out["token_ids"]))


def test_mixed_step_logprobs_equal_one_request_at_a_time(model):
    """The same request's logprobs whether it ran alone or inside mixed steps (prompt logprobs too)."""
    path, _ = model
    prompts, params = requests(seed=5, n=8)
    params = [SamplingParams(temperature=0, max_tokens=p.max_tokens, ignore_eos=True, logprobs=3,
                             prompt_logprobs=1 if i % 2 else None) for i, p in enumerate(params)]
    llm = LLM(path, kvcache_block_size=16, max_model_len=128, max_num_batched_tokens=11, max_num_seqs=3)
    together = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats["mixed_steps"] > 0
    alone = [llm.generate([p], [sp], use_tqdm=False)[0] for p, sp in zip(prompts, params)]
    for a, b in zip(together, alone):
        assert a["token_ids"] == b["token_ids"]
        for da, db in zip(a["logprobs"], b["logprobs"]):
            assert da.keys() == db.keys() and all(math.isclose(da[k], db[k], abs_tol=1e-4) for k in da)
        if b["prompt_logprobs"] is not None:
            for da, db in zip(a["prompt_logprobs"][1:], b["prompt_logprobs"][1:]):
                assert da.keys() == db.keys() and all(math.isclose(da[k], db[k], abs_tol=1e-4) for k in da)
