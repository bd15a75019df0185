"""Scheduler: decodes then prefill chunks under one budget (mixed steps), chunked prefill, max_num_seqs,
preemption by recompute."""
from types import SimpleNamespace

from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import PLACEHOLDER, Sequence, SequenceStatus
from nanovllm.sampling_params import SamplingParams

BS = 16


def make(num_blocks=16, max_tokens=1024, max_seqs=8, prefix_caching=True, speculative_config=None):
    Sequence.block_size = BS
    cfg = SimpleNamespace(max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens, kvcache_block_size=BS,
                          enable_prefix_caching=prefix_caching, max_model_len=4096,
                          speculative_config=speculative_config)
    return Scheduler(cfg, num_blocks)


def step(sched, token=1):
    """Schedule, pretend the model ran, return the batch."""
    batch = sched.schedule()
    tokens = [token if seq.num_computed_tokens + n == len(seq) else None
              for seq, n in zip(batch.seqs, batch.num_new_tokens)]
    sched.postprocess(batch, tokens)
    return batch


def test_prefill_then_decode():
    sched = make()
    a, b = Sequence(list(range(20))), Sequence(list(range(100, 130)))
    sched.add(a), sched.add(b)
    batch = step(sched)
    assert batch.is_prefill and batch.num_new_tokens == [20, 30]
    assert len(a) == 21 and a.status == SequenceStatus.RUNNING
    batch = step(sched)
    assert not batch.is_prefill and batch.num_new_tokens == [1, 1]
    assert a.num_computed_tokens == 21 and len(a) == 22


def test_chunked_prefill_splits_long_prompt():
    sched = make(max_tokens=16)
    a = Sequence(list(range(40)))
    sched.add(a)
    chunks = []
    while len(a) == 40:
        batch = step(sched)
        assert batch.is_prefill
        chunks.append(batch.num_new_tokens[0])
    assert chunks == [16, 16, 8]
    assert a.num_computed_tokens == 40 and len(a) == 41


def test_chunk_budget_shared_by_several_prompts():
    sched = make(max_tokens=32)
    a, b = Sequence(list(range(20))), Sequence(list(range(100, 130)))
    sched.add(a), sched.add(b)
    batch = step(sched)
    assert batch.num_new_tokens == [20, 12]
    assert len(b) == 30 and b.num_computed_tokens == 12     # no token sampled mid-prompt
    batch = step(sched)                             # a decodes while b's last chunk rides along
    assert batch.kind == "mixed" and batch.seqs == [a, b] and batch.num_new_tokens == [1, 18]
    assert batch.num_decodes == 1 and batch.sample_rows == [0, 1]


def test_max_num_seqs_caps_the_batch():
    sched = make(max_seqs=2)
    seqs = [Sequence([i] * 5) for i in range(3)]
    for s in seqs:
        sched.add(s)
    batch = step(sched)
    assert len(batch.seqs) == 2
    batch = step(sched)
    assert not batch.is_prefill and len(batch.seqs) == 2


def test_preemption_recomputes_the_newest():
    sched = make(num_blocks=4, prefix_caching=False)   # no cache hit shortens the recompute
    a, b = Sequence(list(range(32))), Sequence(list(range(100, 132)))   # 2 blocks each, all blocks taken
    sched.add(a), sched.add(b)
    step(sched)                                     # both prefilled: 33 tokens each now, need block 3
    batch = sched.schedule()                        # a gets b's blocks; b is preempted
    assert not batch.is_prefill and batch.seqs == [a]
    assert sched.num_preemptions == 1 and b.status == SequenceStatus.WAITING and b.block_table == []
    assert b.num_computed_tokens == 0
    sched.postprocess(batch, [5])
    sched.finish(a, "length")
    batch = sched.schedule()
    # the preempted sequence is prefilled again over all its tokens, prompt and output, not decoded
    assert batch.is_prefill and batch.seqs == [b] and batch.num_new_tokens == [len(b)]


def test_preempted_sequence_reuses_its_own_cached_blocks():
    sched = make(num_blocks=4)
    a, b = Sequence(list(range(32))), Sequence(list(range(100, 132)))
    sched.add(a), sched.add(b)
    step(sched)
    step(sched)                                     # b preempted, a decodes
    sched.finish(a, "length")
    batch = sched.schedule()
    assert batch.is_prefill and batch.seqs == [b]
    assert b.num_cached_tokens > 0 and b.num_computed_tokens + batch.num_new_tokens[0] == len(b)


def test_preempted_sequence_waits_behind_chunked_prompt():
    sched = make(num_blocks=6, max_tokens=16)
    a = Sequence(list(range(30)))
    sched.add(a)
    step(sched), step(sched)                        # a prefilled in 2 chunks
    c = Sequence(list(range(200, 260)))             # 4 blocks, chunked
    sched.add(c)
    step(sched)                                     # c's first chunk
    assert sched.waiting[0] is c and c.block_table
    sched.preempt(a)
    sched.running.clear()
    assert list(sched.waiting) == [c, a]


def test_finish_frees_blocks():
    sched = make(num_blocks=4)
    a = Sequence(list(range(20)))
    sched.add(a)
    step(sched)
    sched.finish(a, "stop")
    assert sched.block_manager.num_free_blocks == 4 and sched.is_finished()
    assert a.finish_reason == "stop"


def test_nothing_fits_gives_an_empty_batch():
    sched = make(num_blocks=1)
    sched.add(Sequence(list(range(40))))
    assert sched.schedule().seqs == []


def test_sequence_whose_in_flight_token_is_its_last_is_not_scheduled():
    sched = make()
    a = Sequence(list(range(10)), SamplingParams(max_tokens=2))
    b = Sequence(list(range(20, 30)), SamplingParams(max_tokens=5))
    sched.add(a), sched.add(b)
    step(sched)                                       # 1 token each
    batch = sched.schedule()
    sched.postprocess(batch, [PLACEHOLDER, PLACEHOLDER])   # a's 2nd token is in flight: its last
    assert a.will_finish and not b.will_finish
    assert sched.schedule().seqs == [b] and list(sched.running) == [b, a]


def test_newcomer_rides_along_with_decodes():
    sched = make(max_seqs=2)
    a, b, c = Sequence([1] * 5, SamplingParams(max_tokens=2)), Sequence([2] * 5), Sequence([3] * 7)
    for s in (a, b, c):
        sched.add(s)
    assert step(sched).seqs == [a, b]                # two seats
    assert step(sched).kind == "decode"
    sched.finish(a, "length")
    batch = step(sched)
    assert batch.kind == "mixed" and batch.seqs == [b, c] and batch.num_new_tokens == [1, 7]


def test_budget_counts_decodes_first():
    sched = make(max_tokens=10)
    a, b = Sequence([1] * 4), Sequence([2] * 4)
    sched.add(a), sched.add(b)
    step(sched)                                      # 8 prompt tokens
    c = Sequence([3] * 30)
    sched.add(c)
    batch = step(sched)
    assert batch.num_new_tokens == [1, 1, 8] and batch.num_decodes == 2 and batch.sample_rows == [0, 1]
    batch = step(sched)
    assert batch.num_new_tokens == [1, 1, 8] and c.num_computed_tokens == 16


def test_waves_admit_only_once_enough_seats_are_free():
    """admit_min_free_seats > 1 (bench.py --admission-wave): no newcomer while fewer seats are free, unless
    nothing runs; a prompt already being chunked goes on."""
    sched = make(max_seqs=3, max_tokens=64)
    sched.admit_min_free_seats = 2
    first = [Sequence([i] * 5) for i in range(3)]
    late = [Sequence([7] * 5), Sequence([8] * 40)]
    for s in first + late:
        sched.add(s)
    assert step(sched).seqs == first                     # nothing runs: admitted at once
    sched.finish(first[0], "length")
    assert step(sched).kind == "decode"                 # one seat free: no newcomer
    sched.finish(first[1], "length")
    sched.max_num_batched_tokens = 10                    # the 40-token prompt gets a chunk, then goes on
    batch = step(sched)
    assert batch.seqs == [first[2]] + late and batch.num_new_tokens == [1, 5, 4]
    assert len(sched.running) == 2 and sched.max_num_seqs - len(sched.running) < 2
    batch = step(sched)
    assert batch.seqs == [first[2], late[0], late[1]] and batch.num_new_tokens == [1, 1, 8]
