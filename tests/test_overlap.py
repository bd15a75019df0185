"""Overlapped decode (step N launched before step N-1's tokens are read) gives the same outputs as
synchronous steps. A deterministic fake model runner stands in for the GPU, so this runs on CPU."""
import random
from dataclasses import dataclass

import pytest
from tiny_models import make_tiny_model

from nanovllm import LLM, SamplingParams
from nanovllm.engine.logprobs import StepLogprobs
from nanovllm.engine.sequence import PLACEHOLDER

EOS = 256


def next_token(tokens: list[int]) -> int:
    """A made-up model: depends on the last tokens and the length; EOS now and then."""
    h = (tokens[-1] * 31 + tokens[-2 if len(tokens) > 1 else -1] * 7 + len(tokens) * 13) % 997
    return EOS if h % 23 == 0 else h % 250


@dataclass
class FakePending:
    batch: object
    tokens: list[int]
    rows: dict

    def collect(self):
        return self.tokens, fake_logprobs(self.batch.seqs, self.tokens)


def fake_logprobs(seqs, tokens) -> StepLogprobs:
    """A made-up logprob per sampled token, for rows that asked."""
    return StepLogprobs({row: {tok: -float(tok % 5)} for row, (seq, tok) in enumerate(zip(seqs, tokens))
                         if tok is not None and seq.sampling_params.logprobs is not None})


class FakeRunner:
    """run(): synchronous; launch(): resolves placeholders from the previous step like the GPU does."""

    def __init__(self, overlap: bool):
        self.overlap, self.num_launches = overlap, 0

    def shutdown(self) -> None:
        pass

    def can_launch_async(self, batch) -> bool:
        return self.overlap

    def run(self, batch):
        tokens = [next_token(seq.token_ids[:seq.num_computed_tokens + n]) if seq.num_computed_tokens + n == len(seq)
                  else None for seq, n in zip(batch.seqs, batch.num_new_tokens)]
        return tokens, fake_logprobs(batch.seqs, tokens)

    def launch(self, batch, prev):
        self.num_launches += 1
        tokens = [None] * len(batch.seqs)
        for row in batch.sample_rows:      # mixed steps too: a prefill chunk's last token may be in flight
            seq = batch.seqs[row]
            ids = list(seq.token_ids)
            if ids[-1] == PLACEHOLDER:
                ids[-1] = prev.tokens[prev.rows[seq.seq_id]]
            assert PLACEHOLDER not in ids
            tokens[row] = next_token(ids)
        return FakePending(batch, tokens, {batch.seqs[r].seq_id: r for r in batch.sample_rows})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("overlap"))
    make_tiny_model(path)
    return path


def run(model_dir, overlap, prompts, params, **kw):
    llm = LLM(model_dir, kvcache_block_size=16, max_model_len=256, **kw)
    llm.model_runner = FakeRunner(overlap)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert not llm.scheduler.running and not llm.scheduler.waiting
    return outs, llm


@pytest.mark.parametrize("kw", [dict(num_kvcache_blocks=64), dict(num_kvcache_blocks=16, max_num_seqs=5),
                                dict(num_kvcache_blocks=64, max_num_batched_tokens=16)])
def test_overlapped_decode_matches_synchronous(model_dir, kw):
    rng = random.Random(0)
    prompts = [[rng.randrange(250) for _ in range(rng.randrange(1, 60))] for _ in range(12)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randrange(1, 50), ignore_eos=i % 3 == 0,
                             stop_token_ids=[7] if i % 4 == 1 else [], logprobs=1 if i % 2 else None)
              for i in range(12)]
    sync, _ = run(model_dir, False, prompts, params, **kw)
    over, llm = run(model_dir, True, prompts, params, **kw)
    assert llm.model_runner.num_launches > 0
    if kw["num_kvcache_blocks"] == 16:
        assert llm.scheduler.num_preemptions > 0
    assert [o["token_ids"] for o in over] == [o["token_ids"] for o in sync]
    assert [o["finish_reason"] for o in over] == [o["finish_reason"] for o in sync]
    assert all(PLACEHOLDER not in o["token_ids"] for o in over)
    assert [o["logprobs"] for o in over] == [o["logprobs"] for o in sync]
    assert all(len(o["logprobs"]) == len(o["token_ids"]) for o in over if o["logprobs"] is not None)
    assert {o["finish_reason"] for o in sync} >= {"stop", "length"}


def test_eager_inputs_take_in_flight_tokens_from_the_previous_step(model_dir):
    """An eager step launched behind the step in flight (a step too large for a CUDA graph): prepare() takes
    each placeholder input token from that step's sampled ids, giving the inputs of the same batch with the
    tokens known."""
    from types import SimpleNamespace

    import torch

    from nanovllm.engine.scheduler import ScheduledBatch
    from nanovllm.engine.sequence import Sequence
    llm = LLM(model_dir, kvcache_block_size=16, max_model_len=256, num_kvcache_blocks=64)
    rng = random.Random(1)
    decodes = [Sequence([rng.randrange(250) for _ in range(rng.randrange(2, 40))]) for _ in range(3)]
    chunk = Sequence([rng.randrange(250) for _ in range(30)])
    for seq in decodes + [chunk]:
        llm.scheduler.block_manager.allocate(seq)
    for seq in decodes:
        seq.num_computed_tokens = len(seq) - 1
    ids, positions, meta, rows = llm.model_runner.prepare(ScheduledBatch(decodes + [chunk], [1, 1, 1, 30], 3))
    sampled = [seq.token_ids[-1] for seq in decodes]
    for seq in decodes:
        seq.token_ids[-1] = PLACEHOLDER
    # the step in flight sampled [99, sampled[2], sampled[1], sampled[0]]: decodes[i] is its row 3 - i
    prev = SimpleNamespace(token_ids=torch.tensor([99, *sampled[::-1]]),
                           rows={seq.seq_id: 3 - i for i, seq in enumerate(decodes)})
    ids2, positions2, meta2, rows2 = llm.model_runner.prepare(ScheduledBatch(decodes + [chunk], [1, 1, 1, 30], 3),
                                                              prev)
    assert ids2.tolist() == ids.tolist() and torch.equal(positions2, positions) and rows2 == rows == [0, 1, 2, 3]
    assert torch.equal(meta2.slot_mapping, meta.slot_mapping)
