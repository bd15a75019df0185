"""Tensor parallelism on CPU (gloo): TP=2 gives TP=1's tokens; workers start, fail and end cleanly."""
import multiprocessing
import random
import subprocess
import sys
import textwrap
import time

import pytest
from tiny_models import hf_greedy, make_tiny_model

from nanovllm import LLM, SamplingParams

KW = dict(kvcache_block_size=16, max_model_len=256)


def prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(n)] for n in lengths]


def generate(llm, ps, **params):
    return llm.generate(ps, SamplingParams(**(dict(temperature=0, max_tokens=16) | params)), use_tqdm=False)


@pytest.mark.parametrize("cfg", [dict(num_heads=4, num_kv_heads=2, head_dim=32),              # GQA, untied
                                 dict(num_heads=4, num_kv_heads=1, head_dim=32, tie=True),    # KV heads replicated
                                 dict(num_heads=8, num_kv_heads=4, head_dim=64, tie=True)])
def test_tp2_equals_tp1_and_hf(tmp_path, cfg):
    hf = make_tiny_model(str(tmp_path), **cfg)
    ps = prompts([3, 17, 40, 70])
    tp1 = generate(LLM(str(tmp_path), num_kvcache_blocks=64, **KW), ps)
    llm = LLM(str(tmp_path), num_kvcache_blocks=64, tensor_parallel_size=2, **KW)
    try:
        first, second = generate(llm, ps), generate(llm, ps)
        assert [o["token_ids"] for o in first] == [o["token_ids"] for o in tp1]
        assert [o["token_ids"] for o in first] == [hf_greedy(hf, p, 16) for p in ps]
        assert [o["token_ids"] for o in second] == [o["token_ids"] for o in tp1]
        assert second[3]["num_cached_tokens"] > 0                       # prefix cache hit under TP
    finally:
        llm.shutdown()
    assert multiprocessing.active_children() == []


def test_tp2_with_preemption_chunks_and_logprobs(tmp_path):
    make_tiny_model(str(tmp_path), num_heads=4, num_kv_heads=2, head_dim=32)
    ps = prompts([30, 41, 25, 50, 12], seed=2)
    kw = dict(num_kvcache_blocks=10, max_num_batched_tokens=32, max_model_len=128, kvcache_block_size=16)
    params = dict(max_tokens=30, logprobs=2, prompt_logprobs=1)
    tp1 = generate(LLM(str(tmp_path), **kw), ps, **params)
    llm = LLM(str(tmp_path), tensor_parallel_size=2, **kw)
    try:
        tp2 = generate(llm, ps, **params)
        assert llm.scheduler.num_preemptions > 0
    finally:
        llm.shutdown()
    for a, b in zip(tp1, tp2):
        assert a["token_ids"] == b["token_ids"]
        for da, db in zip(a["logprobs"] + a["prompt_logprobs"][1:], b["logprobs"] + b["prompt_logprobs"][1:]):
            assert set(da) == set(db) and all(abs(da[t] - db[t]) < 1e-4 for t in da)


def test_worker_error_reaches_the_user(tmp_path):
    make_tiny_model(str(tmp_path))
    llm = LLM(str(tmp_path), num_kvcache_blocks=32, tensor_parallel_size=2, **KW)
    llm.model_runner.workers.call("no_such_method")
    with pytest.raises(RuntimeError, match="worker 1 failed(.|\n)*no_such_method"):
        generate(llm, prompts([5]))
    llm.shutdown()
    assert multiprocessing.active_children() == []


def test_bad_tp_size_is_a_value_error(tmp_path):
    make_tiny_model(str(tmp_path), num_heads=4, num_kv_heads=2)
    with pytest.raises(ValueError, match="tensor_parallel_size=3"):
        LLM(str(tmp_path), tensor_parallel_size=3, **KW)


SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from nanovllm import LLM, SamplingParams
    llm = LLM({model!r}, num_kvcache_blocks=32, tensor_parallel_size=2, kvcache_block_size=16, max_model_len=128)
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    print("TOKENS", out[0]["token_ids"])
    {ending}
""")


def test_three_engines_at_once_and_exit_without_shutdown(tmp_path):
    """Three processes at once, each with a TP=2 engine (distinct rendezvous ports); each exits without calling
    shutdown in its own way (falling off the end, `del llm`, SystemExit), in time, leaving no process behind."""
    import os
    make_tiny_model(str(tmp_path))
    scripts = [SCRIPT.format(tests=os.path.dirname(__file__), model=str(tmp_path), ending=ending)
               for ending in ("", "del llm", "raise SystemExit(0)")]
    runs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True) for script in scripts]
    for run in runs:
        out, err = run.communicate(timeout=240)
        assert run.returncode == 0, err[-2000:]
        assert "TOKENS" in out
    for run in runs:    # nothing of that session is left (multiprocessing's helpers take a moment to go)
        deadline = time.time() + 10
        while (left := session_processes(run.pid)) and time.time() < deadline:
            time.sleep(0.2)
        assert left == []


def session_processes(sid: int) -> list[str]:
    return subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True).stdout.split()


def test_tp2_with_int8_kv_cache(tmp_path):
    make_tiny_model(str(tmp_path), num_heads=4, num_kv_heads=2, head_dim=32)
    ps = prompts([9, 33, 60], seed=4)
    tp1 = generate(LLM(str(tmp_path), num_kvcache_blocks=64, kv_cache_dtype="int8", **KW), ps)
    llm = LLM(str(tmp_path), num_kvcache_blocks=64, kv_cache_dtype="int8", tensor_parallel_size=2, **KW)
    try:
        assert [o["token_ids"] for o in generate(llm, ps)] == [o["token_ids"] for o in tp1]
    finally:
        llm.shutdown()


def test_failed_start_leaves_no_worker(tmp_path):
    make_tiny_model(str(tmp_path))
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(str(tmp_path), num_kvcache_blocks=2, tensor_parallel_size=2, **KW)    # cache too small
    assert multiprocessing.active_children() == []


def test_tp2_with_speculative_decoding(tmp_path):
    """Drafted rows reach the workers inside the pickled sequences; the tokens equal TP=1 without drafts."""
    make_tiny_model(str(tmp_path), num_heads=4, num_kv_heads=2, head_dim=32)
    ps = [p * 4 for p in prompts([5, 7, 3], seed=5)]          # repeated motifs: lookups find drafts
    tp1 = generate(LLM(str(tmp_path), num_kvcache_blocks=64, **KW), ps, max_tokens=24)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    llm = LLM(str(tmp_path), num_kvcache_blocks=64, tensor_parallel_size=2, speculative_config=spec, **KW)
    try:
        outs = generate(llm, ps, max_tokens=24)
        assert [o["token_ids"] for o in outs] == [o["token_ids"] for o in tp1]
        assert sum(o["metrics"]["num_accepted_tokens"] for o in outs) > 0
    finally:
        llm.shutdown()
