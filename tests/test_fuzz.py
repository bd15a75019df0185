"""A seeded fuzz of the engine's error paths (issue 44): calls mixing good and bad requests, bad
sampling_params, interruptions at random steps, on engines with tiny caches and budgets. After every call the
engine must be idle (queues empty, nothing in flight, every block free), and a fixed good call must give what
a fresh engine gives."""
import random

import pytest
from tiny_models import make_tiny_model

from nanovllm import LLM, SamplingParams

ENGINES = [dict(num_kvcache_blocks=16, max_num_seqs=3, max_num_batched_tokens=24),     # preemption, chunks
           dict(num_kvcache_blocks=64, max_num_seqs=8, max_num_batched_tokens=7),
           dict(num_kvcache_blocks=64, enable_prefix_caching=False)]
BAD_PROMPTS = [None, [], [-1], [10**9], [1.5], "x\ud800", {"a": 1}]
CHECK = ([[3, 1, 4, 1, 5, 9, 2, 6], list(range(30, 70))], SamplingParams(temperature=0, max_tokens=10,
                                                                           ignore_eos=True))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fuzz"))
    make_tiny_model(path)
    return path


def idle(llm, num_blocks) -> bool:
    return (not llm.scheduler.running and not llm.scheduler.waiting and llm.pending is None
            and llm.scheduler.block_manager.num_free_blocks == num_blocks)


def test_fuzzed_calls_leave_the_engine_as_a_fresh_one(model_dir):
    rng = random.Random(0)
    engines, expected = [], []
    for kw in ENGINES:
        kw = dict(kvcache_block_size=16, max_model_len=128) | kw
        expected.append([o["token_ids"] for o in LLM(model_dir, **kw).generate(*CHECK, use_tqdm=False)])
        engines.append((LLM(model_dir, **kw), kw["num_kvcache_blocks"]))
    run_original = [llm.model_runner.run for llm, _ in engines]
    outcomes = {"ok": 0, "interrupted": 0, "refused": 0}
    for call in range(150):
        which = rng.randrange(len(engines))
        llm, num_blocks = engines[which]
        prompts = [rng.choice(BAD_PROMPTS) if rng.random() < 0.2 else
                   [rng.randrange(250) for _ in range(rng.randrange(1, 60))] for _ in range(rng.randrange(1, 8))]
        params = [SamplingParams(temperature=rng.choice([0, 0.8]), max_tokens=rng.randrange(1, 20),
                                 seed=rng.choice([None, 7]), logprobs=rng.choice([None, 2])) for _ in prompts]
        if rng.random() < 0.1:
            params[rng.randrange(len(params))] = {"temperature": 0}          # not a SamplingParams
        interrupt_at = rng.randrange(1, 12) if rng.random() < 0.4 else None
        calls = [0]

        def run(batch, *args, _orig=run_original[which], _at=interrupt_at):
            calls[0] += 1
            if _at is not None and calls[0] >= _at:
                raise rng.choice([KeyboardInterrupt, RuntimeError])("fuzz")
            return _orig(batch, *args)

        llm.model_runner.run = run
        try:
            outs = llm.generate(prompts, params, use_tqdm=False)
            outcomes["ok"] += 1
            for prompt, out in zip(prompts, outs):
                assert (out["finish_reason"] == "error") == (prompt in BAD_PROMPTS or not isinstance(prompt, list)
                                                              or not prompt), (prompt, out)
        except (KeyboardInterrupt, RuntimeError):
            outcomes["interrupted"] += 1
        except TypeError:
            outcomes["refused"] += 1
        finally:
            llm.model_runner.run = run_original[which]
        assert idle(llm, num_blocks), f"call {call}"
        if call % 5 == 4:
            assert [o["token_ids"] for o in llm.generate(*CHECK, use_tqdm=False)] == expected[which], call
    assert min(outcomes.values()) > 0, outcomes
