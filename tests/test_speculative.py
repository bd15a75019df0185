"""Speculative decoding by prompt lookup: the proposer, the settings, the rejection sampler's distribution,
and the engine's greedy tokens with drafts equal to transformers' over random schedules (chunked prefill,
preemption, prefix caching, mixed steps, stop conditions). CPU, tiny float32 model."""
import random
import re
from types import SimpleNamespace

import pytest
import torch
from tiny_models import hf_greedy, make_tiny_model

from nanovllm import LLM, SamplingParams
from nanovllm.config import SpeculativeConfig
from nanovllm.engine.ngram import propose_ngram
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import Sequence
from nanovllm.layers.rejection_sampler import verify
from nanovllm.layers.sampler import SamplingTensors

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


def test_propose_ngram_takes_the_longest_suffix_and_its_latest_occurrence():
    assert propose_ngram([1, 2, 3, 4, 5, 1, 2, 3], 3, 1, 3) == [4, 5, 1]
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 8, 2, 3], 2, 1, 3) == [8, 2]   # "2 3" last seen before 8
    assert propose_ngram([5, 1, 2, 6, 1, 2], 2, 2, 2) == [6, 1]
    assert propose_ngram([7, 1, 2, 3, 1, 2], 2, 3, 3) == []                  # no earlier "3 1 2"
    assert propose_ngram([1, 2, 1, 2], 5, 1, 3) == [1, 2]                    # stops at the end of the history
    assert propose_ngram([4], 3, 1, 3) == [] and propose_ngram([], 3, 1, 3) == []


def test_proposer_history_follows_a_growing_sequence():
    from nanovllm.engine.ngram import NgramProposer
    proposer = NgramProposer(SpeculativeConfig.from_dict(NGRAM))
    rng = random.Random(0)
    seq = Sequence([rng.randrange(5) for _ in range(3)])
    for _ in range(200):     # tokens appended a few at a time (a running sequence's only change)
        assert proposer.propose(seq, 3) == propose_ngram(seq.token_ids, 3, 1, 4)
        seq.token_ids += [rng.randrange(5) for _ in range(rng.randrange(1, 4))]


@pytest.mark.parametrize("bad, message", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "choose one of ['ngram']"),
    ({"method": "ngram"}, "needs 'num_speculative_tokens'"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "must be an integer >= 1"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"}, "unknown key"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "is over"),
    ("ngram", "must be a dict"),
])
def test_bad_speculative_config_names_what_is_allowed(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SpeculativeConfig.from_dict(bad)


def test_speculative_config_defaults_as_vllm():
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)
    c = SpeculativeConfig.from_dict({"num_speculative_tokens": 2, "prompt_lookup_max": 3})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (3, 3)


def _params(rows, temperature=1.0, top_k=None, seed=None):
    vocab = 1000
    gens = [torch.Generator().manual_seed(seed + r) for r in range(rows)] if seed is not None else [None] * rows
    return SamplingTensors(temperatures=torch.full((rows,), temperature),
                           top_ks=torch.full((rows,), float(top_k or vocab)), top_ps=torch.ones(rows),
                           min_ps=torch.zeros(rows), generators=gens,
                           needs_filter=top_k is not None, all_greedy=temperature == 0)


@pytest.mark.parametrize("top_k", [None, 3])
def test_rejection_sampler_keeps_the_target_distribution(top_k):
    """Many rows with the same two-position logits and the same drafts (one likely, one unlikely guess):
    the first token is distributed as p_0 and, after an accepted first draft, the second as p_1, within 4
    standard errors per token (fixed seed)."""
    torch.manual_seed(0)
    rows, vocab = 20000, 6
    p0 = torch.tensor([0.05, 0.4, 0.2, 0.15, 0.1, 0.1])
    p1 = torch.tensor([0.3, 0.05, 0.25, 0.2, 0.1, 0.1])
    p2 = torch.full((vocab,), 1 / vocab)
    logits = torch.stack([p0.log(), p1.log(), p2.log()]).repeat(rows, 1)
    drafts = [[1, 4]] * rows                       # guess 1 (p0: 0.4), then 4 (p1: 0.1)
    out = verify(logits, drafts, _params(rows, top_k=top_k))
    if top_k:   # what the sampler draws from: the top-k kept and renormalized
        p0 = torch.where(p0 >= p0.topk(top_k).values[-1], p0, 0.0)
        p0 /= p0.sum()
        p1 = torch.where(p1 >= p1.topk(top_k).values[-1], p1, 0.0)
        p1 /= p1.sum()
    first = torch.bincount(torch.tensor([o[0] for o in out]), minlength=vocab).float() / rows
    assert ((first - p0).abs() <= 4 * (p0 * (1 - p0) / rows).sqrt() + 1e-3).all(), (first, p0)
    after = [o[1] for o in out if o[0] == 1]
    second = torch.bincount(torch.tensor(after), minlength=vocab).float() / len(after)
    assert ((second - p1).abs() <= 4 * (p1 * (1 - p1) / len(after)).sqrt() + 1e-3).all(), (second, p1)
    assert all(len(o) == 3 for o in out if o[:2] == [1, 4])     # both accepted: one more token
    assert all(len(o) <= 3 for o in out)


def test_rejection_sampler_greedy_is_the_argmax_and_seeds_repeat():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0],   # row 0: argmaxes 1, 0, 2
                           [1.0, 0.0, 0.0]])                                     # row 1: no drafts
    assert verify(logits, [[1, 0], []], _params(2, temperature=0)) == [[1, 0, 2], [0]]
    assert verify(logits, [[1, 2], []], _params(2, temperature=0)) == [[1, 0], [0]]
    assert verify(logits, [[2, 2], []], _params(2, temperature=0)) == [[1], [0]]
    sampled = [verify(logits, [[1, 0], []], _params(2, seed=7)) for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_postprocess_keeps_the_accepted_drafts_and_their_kv():
    Sequence.block_size = 16
    cfg = SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=64, kvcache_block_size=16, enable_prefix_caching=True,
                          max_model_len=256, speculative_config=SpeculativeConfig.from_dict(NGRAM))
    sched = Scheduler(cfg, 8)
    seq = Sequence([1, 2, 3, 4, 1, 2], SamplingParams(max_tokens=20))
    sched.add(seq)
    sched.postprocess(sched.schedule(), [3])                  # prefill: 6 computed, token 3 appended
    assert seq.token_ids == [1, 2, 3, 4, 1, 2, 3] and seq.num_computed_tokens == 6
    batch = sched.schedule()                                   # "1 2 3" seen before: drafts 4 1 2
    assert batch.num_drafted == 1 and batch.num_new_tokens == [4] and seq.token_ids[-3:] == [4, 1, 2]
    assert batch.logit_positions([0, 4]) == [0, 1, 2, 3]
    sched.postprocess(batch, [[4, 1, 9]])                      # two accepted, then the model's 9
    assert seq.token_ids == [1, 2, 3, 4, 1, 2, 3, 4, 1, 9] and seq.num_drafts == 0
    assert seq.num_computed_tokens == 9 and (seq.num_draft_tokens, seq.num_accepted_tokens) == (3, 2)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("spec"))
    return path, make_tiny_model(path, num_heads=4, num_kv_heads=2, head_dim=32)


def requests(seed: int, n: int):
    """Prompts that repeat themselves (so lookups hit), some behind a shared 32-token prefix; random
    max_tokens and stop ids; odd requests ask for logprobs (they decode without drafts)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(250) for _ in range(32)]
    prompts, params = [], []
    for i in range(n):
        motif = [rng.randrange(250) for _ in range(rng.randrange(2, 8))]
        own = motif * rng.randrange(1, 6) + [rng.randrange(250) for _ in range(rng.randrange(0, 4))]
        prompts.append(prefix + own if i % 3 == 0 else own)
        params.append(SamplingParams(temperature=0, max_tokens=rng.randrange(1, 30), ignore_eos=True,
                                     logprobs=1 if i % 4 == 1 else None))
    return prompts, params


SCHEDULES = {
    "roomy": dict(max_num_batched_tokens=256, max_num_seqs=8, num_kvcache_blocks=64),
    "budget7-seats3-preempt": dict(max_num_batched_tokens=7, max_num_seqs=3, num_kvcache_blocks=9),
    "budget20-seats5-preempt": dict(max_num_batched_tokens=20, max_num_seqs=5, num_kvcache_blocks=8),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_speculative_greedy_tokens_equal_transformers(model, name):
    path, hf = model
    prompts, params = requests(seed=len(name), n=14)
    llm = LLM(path, kvcache_block_size=16, max_model_len=128, speculative_config=NGRAM, **SCHEDULES[name])
    outs = llm.generate(prompts, params, use_tqdm=False)
    if "preempt" in name:
        assert llm.scheduler.num_preemptions > 0
    assert sum(o["metrics"]["num_accepted_tokens"] for o in outs) > 0
    for prompt, p, out in zip(prompts, params, outs):
        assert out["token_ids"] == hf_greedy(hf, prompt, p.max_tokens), out
        m = out["metrics"]
        assert 0 <= m["num_accepted_tokens"] <= m["num_draft_tokens"]
        if p.logprobs is not None:
            assert m["num_draft_tokens"] == 0 and len(out["logprobs"]) == len(out["token_ids"])
    assert llm.scheduler.block_manager.num_free_blocks == len(llm.scheduler.block_manager.blocks)


def test_stops_inside_accepted_drafts_cut_the_output_there(model):
    """A stop token, a stop string or max_tokens reached in the middle of accepted drafts: the output ends
    there as it does without speculation."""
    path, _ = model
    prompts, _ = requests(seed=3, n=6)
    plain = LLM(path, kvcache_block_size=16, max_model_len=128, num_kvcache_blocks=64, max_num_seqs=16)
    spec = LLM(path, kvcache_block_size=16, max_model_len=128, num_kvcache_blocks=64, max_num_seqs=16,
               speculative_config=NGRAM)
    free = plain.generate(prompts, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    for out, prompt in zip(free, prompts):
        ids = out["token_ids"]
        greedy = dict(temperature=0, ignore_eos=True)
        for params in (SamplingParams(max_tokens=40, stop_token_ids=[ids[len(ids) // 2]], **greedy),
                       SamplingParams(max_tokens=len(ids) // 3 + 1, **greedy),
                       SamplingParams(max_tokens=40, stop=[out["text"][5:8]], **greedy)):
            want, got = (llm.generate([prompt], params, use_tqdm=False)[0] for llm in (plain, spec))
            assert (got["token_ids"], got["text"], got["finish_reason"]) == \
                (want["token_ids"], want["text"], want["finish_reason"])


def test_sampled_speculative_run_is_seeded_and_counts(model):
    path, _ = model
    prompts, _ = requests(seed=5, n=4)
    llm = LLM(path, kvcache_block_size=16, max_model_len=128, num_kvcache_blocks=64, max_num_seqs=16,
              speculative_config=NGRAM)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, ignore_eos=True, seed=11)
    first, again = (llm.generate(prompts, params, use_tqdm=False) for _ in range(2))
    assert [o["token_ids"] for o in first] == [o["token_ids"] for o in again]
    assert all(len(o["token_ids"]) == 20 for o in first)


def test_speculation_turns_off_above_disable_by_batch_size(model):
    path, _ = model
    prompts, _ = requests(seed=6, n=6)
    llm = LLM(path, kvcache_block_size=16, max_model_len=128, num_kvcache_blocks=64, max_num_seqs=16,
              speculative_config=NGRAM | {"disable_by_batch_size": 2})
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    drafted = [o["metrics"]["num_draft_tokens"] for o in outs]
    assert sum(drafted) == 0     # six running at once, all decoding together: no step speculated


def test_no_drain_for_drafts_when_no_running_request_may_have_them():
    """Requests with logprobs never get drafts, so a step of only such requests keeps its asynchronous
    launch (wants_drafts is what makes the engine wait for the step in flight)."""
    Sequence.block_size = 16
    cfg = SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=64, kvcache_block_size=16, enable_prefix_caching=True,
                          max_model_len=256, speculative_config=SpeculativeConfig.from_dict(NGRAM))
    sched = Scheduler(cfg, 8)
    seq = Sequence([1, 2, 1, 2], SamplingParams(max_tokens=20, logprobs=1))
    sched.add(seq)
    sched.postprocess(sched.schedule(), [1])
    assert not sched.wants_drafts()
    sched.add(Sequence([1, 2, 1, 2], SamplingParams(max_tokens=20)))
    sched.postprocess(sched.schedule(), [None, 1])
    assert sched.wants_drafts()
