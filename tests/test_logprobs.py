"""Logprobs and prompt logprobs against transformers' log_softmax; perplexity against HF's loss."""
import math
import random

import pytest
import torch
from tiny_models import make_tiny_model

from nanovllm import LLM, SamplingParams
from nanovllm.tools.perplexity import perplexity, windows


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("logprobs"))
    hf = make_tiny_model(path, num_heads=4, num_kv_heads=2, head_dim=32)
    return path, hf


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row p is log p(. | ids[:p+1])."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def llm_for(path, **kw):
    return LLM(path, **(dict(kvcache_block_size=16, num_kvcache_blocks=128, max_model_len=512) | kw))


def prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(n)] for n in lengths]


def check_sampled(hf, out, k):
    ids = out["prompt_token_ids"] + out["token_ids"]
    ref = hf_logprobs(hf, ids)
    n = len(out["prompt_token_ids"])
    assert len(out["logprobs"]) == len(out["token_ids"])
    for i, (token, entry) in enumerate(zip(out["token_ids"], out["logprobs"])):
        row = ref[n - 1 + i]
        assert entry[token] == pytest.approx(row[token].item(), abs=1e-4)
        top = set(row.topk(k).indices.tolist())
        assert top <= set(entry) and len(entry) <= k + 1
        for t in top:
            assert entry[t] == pytest.approx(row[t].item(), abs=1e-4)


def check_prompt(hf, out, k):
    ids = out["prompt_token_ids"]
    ref = hf_logprobs(hf, ids)
    lps = out["prompt_logprobs"]
    assert len(lps) == len(ids) and lps[0] is None
    for p in range(1, len(ids)):
        row = ref[p - 1]
        assert lps[p][ids[p]] == pytest.approx(row[ids[p]].item(), abs=1e-4)
        assert set(row.topk(k).indices.tolist()) <= set(lps[p])


def test_sampled_logprobs_equal_hf(pair):
    path, hf = pair
    outs = llm_for(path).generate(prompts([5, 30]), SamplingParams(temperature=0, max_tokens=12, logprobs=5),
                                  use_tqdm=False)
    for out in outs:
        check_sampled(hf, out, 5)
        assert out["cumulative_logprob"] == pytest.approx(sum(d[t] for d, t in zip(out["logprobs"],
                                                                                   out["token_ids"])))


def test_logprobs_are_before_temperature(pair):
    path, hf = pair
    out = llm_for(path).generate(prompts([9]), SamplingParams(temperature=0.7, top_k=5, max_tokens=10, logprobs=2,
                                                              seed=1), use_tqdm=False)[0]
    check_sampled(hf, out, 2)


def test_prompt_logprobs_equal_hf_with_chunks_and_cache(pair):
    path, hf = pair
    ps = prompts([1, 20, 45])
    params = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3, logprobs=0)
    for llm in (llm_for(path), llm_for(path, max_num_batched_tokens=16)):
        first = llm.generate(ps, params, use_tqdm=False)
        second = llm.generate(ps, params, use_tqdm=False)       # would hit the prefix cache
        for a, b in zip(first, second):
            check_prompt(hf, a, 3)
            assert a["prompt_logprobs"] == b["prompt_logprobs"] and a["logprobs"] == b["logprobs"]
            assert all(len(d) == 1 for d in a["logprobs"])       # logprobs=0: the sampled token only
    plain = llm.generate(ps, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert plain[2]["num_cached_tokens"] > 0 and plain[2]["logprobs"] is None


def test_prompt_logprobs_survive_preemption(pair):
    path, hf = pair
    ps = prompts([30, 41, 25, 50], seed=3)
    llm = llm_for(path, num_kvcache_blocks=9, max_model_len=128)
    outs = llm.generate(ps, SamplingParams(temperature=0, max_tokens=40, prompt_logprobs=1, logprobs=1),
                        use_tqdm=False)
    assert llm.scheduler.num_preemptions > 0
    for out in outs:
        check_prompt(hf, out, 1)
        check_sampled(hf, out, 1)


@pytest.mark.parametrize("kw", [dict(logprobs=21), dict(prompt_logprobs=-1), dict(logprobs=2.5)])
def test_bad_logprob_counts(kw):
    with pytest.raises(ValueError, match=r"\[0, 20\]"):
        SamplingParams(**kw)


def test_windows_score_every_token_once():
    for n, max_len in [(10, 4), (100, 32), (7, 50), (33, 2)]:
        scored = []
        for begin, end, first in windows(n, max_len):
            assert end - begin <= max_len
            scored += list(range(begin + first, end))
        assert scored == list(range(1, n))


def test_perplexity_equals_hf(pair):
    path, hf = pair
    ids = prompts([120], seed=5)[0]
    with torch.no_grad():
        loss = hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    llm = llm_for(path)
    result = perplexity(llm, ids, max_len=200)
    assert result["num_windows"] == 1 and result["num_scored_tokens"] == 119
    assert result["perplexity"] == pytest.approx(math.exp(loss), rel=1e-4)
    # sliding windows: each token scored with the context its window gives it, as HF computes it
    sliding = perplexity(llm, ids, max_len=40)
    nll = 0.0
    for begin, end, first in windows(len(ids), 40):
        ref = hf_logprobs(hf, ids[begin:end])
        nll -= sum(ref[i - 1, ids[begin + i]].item() for i in range(first, end - begin))
    assert sliding["num_windows"] > 1
    assert sliding["perplexity"] == pytest.approx(math.exp(nll / 119), rel=1e-4)


def test_perplexity_cli_on_demo_model(tmp_path):
    import json
    import subprocess
    import sys
    out = tmp_path / "ppl.json"
    subprocess.run([sys.executable, "-m", "nanovllm.tools.perplexity", "--model", "nanovllm/demo/zen-qwen3",
                    "--text", "nanovllm/demo/zen.txt", "--max-len", "128", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    record = json.loads(out.read_text())
    assert record["num_windows"] > 1 and 1.0 <= record["perplexity"] < 1.5   # it memorized this text
