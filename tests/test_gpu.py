"""GPU path (Triton kernels, CUDA graphs) against the CPU reference path and transformers."""
import gc
import random

import pytest
import torch
from tiny_models import hf_greedy, make_tiny_model

from nanovllm import LLM, SamplingParams
from nanovllm.demo import DEMO_MODEL_DIR

pytestmark = pytest.mark.cuda
# the demo model on the GPU beside others; 16 seats: 10 decode graphs to capture, not 136 (the first test keeps
# the default seats, so a default-size capture stays covered)
DEMO_GPU = dict(device="cuda", max_model_len=1024, gpu_memory_utilization=0.3, max_num_seqs=16)


def greedy_ids(llm, prompts, max_tokens=32):
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    return [o["token_ids"] for o in outs]


def test_demo_model_gpu_equals_cpu():
    prompts = ["Beautiful is better than", "Errors should never", "Special cases aren't"]
    cpu = greedy_ids(LLM(DEMO_MODEL_DIR, device="cpu", max_model_len=1024), prompts, 60)
    for eager in (True, False):
        gpu = LLM(DEMO_MODEL_DIR, device="cuda", max_model_len=1024, enforce_eager=eager,
                  gpu_memory_utilization=0.3)
        assert gpu.model_runner.backend.name == "triton"
        assert (gpu.model_runner.graphs is None) == eager
        assert greedy_ids(gpu, prompts, 60) == cpu
        del gpu


@pytest.mark.parametrize("cfg", [dict(num_heads=4, num_kv_heads=2, head_dim=64),
                                 dict(num_heads=8, num_kv_heads=2, head_dim=128, tie=True),
                                 dict(num_heads=4, num_kv_heads=4, head_dim=64)])
def test_tiny_models_gpu_equal_cpu_and_hf(tmp_path, cfg):
    hf = make_tiny_model(str(tmp_path), **cfg)
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (1, 9, 16, 40, 75, 130)]
    kw = dict(kvcache_block_size=16, max_model_len=512, max_num_seqs=16)   # 10 decode graphs, not 136
    cpu = greedy_ids(LLM(str(tmp_path), device="cpu", num_kvcache_blocks=128, **kw), prompts)
    assert cpu == [hf_greedy(hf, p, 32) for p in prompts]
    variants = [dict(num_kvcache_blocks=128),                                   # graphs, prefix cache
                dict(num_kvcache_blocks=128, enforce_eager=True),
                dict(num_kvcache_blocks=128, max_num_batched_tokens=32),        # chunked prefill
                dict(num_kvcache_blocks=14, max_num_seqs=6, max_model_len=208),  # preemption
                dict(num_kvcache_blocks=128, max_num_seqs=2)]                     # mixed steps on graphs
    for v in variants:
        llm = LLM(str(tmp_path), device="cuda", **(kw | v))
        assert greedy_ids(llm, prompts) == cpu, v
        assert greedy_ids(llm, prompts) == cpu, v                               # second run: cache hits


def test_capture_survives_collecting_an_earlier_engine(tmp_path):
    """An engine freed only by the garbage collector (a reference cycle), collected while the next engine
    captures its graphs, destroys its graphs on the capturing stream and would fail that capture."""
    make_tiny_model(str(tmp_path), num_heads=4, num_kv_heads=2, head_dim=64)
    kw = dict(device="cuda", kvcache_block_size=16, max_model_len=256, num_kvcache_blocks=64, max_num_seqs=4,
              max_num_batched_tokens=128)
    old = LLM(str(tmp_path), **kw)
    want = greedy_ids(old, [[5, 6, 7]])
    old.cycle = old
    del old
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)            # a full collection every few allocations, during the captures too
    try:
        llm = LLM(str(tmp_path), **kw)
    finally:
        gc.set_threshold(*thresholds)
    assert greedy_ids(llm, [[5, 6, 7]]) == want


def test_every_batch_size_runs_on_a_graph(tmp_path):
    make_tiny_model(str(tmp_path), num_heads=4, num_kv_heads=2, head_dim=64)
    llm = LLM(str(tmp_path), device="cuda", kvcache_block_size=16, max_model_len=256, max_num_seqs=37,
              num_kvcache_blocks=512)
    graphs = llm.model_runner.graphs
    assert graphs.sizes[-1] == 37 and all(graphs.can_run(n) for n in range(1, 38))
    eager = LLM(str(tmp_path), device="cuda", kvcache_block_size=16, max_model_len=256, max_num_seqs=37,
                num_kvcache_blocks=512, enforce_eager=True)
    rng = random.Random(1)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(1, 60))] for _ in range(37)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randrange(1, 30)) for _ in prompts]
    a = llm.generate(prompts, params, use_tqdm=False)
    b = eager.generate(prompts, params, use_tqdm=False)
    assert [o["token_ids"] for o in a] == [o["token_ids"] for o in b]


def test_every_mixed_graph_size_matches_eager(tmp_path):
    """Steps with prefill chunks of exactly every captured token count, one less and one more, most with
    decode rows first (the graph's decode-kernel launch): the graph's logits equal the eager forward's for
    the same batch."""
    from nanovllm.attention.metadata import use_metadata
    from nanovllm.engine.scheduler import ScheduledBatch
    from nanovllm.engine.sequence import Sequence
    make_tiny_model(str(tmp_path), num_heads=4, num_kv_heads=2, head_dim=64)
    llm = LLM(str(tmp_path), device="cuda", kvcache_block_size=16, max_model_len=512, max_num_seqs=32,
              max_num_batched_tokens=400, num_kvcache_blocks=512, enable_prefix_caching=False)
    runner, rng = llm.model_runner, random.Random(2)
    assert runner.mixed_graphs.sizes == [64, 128, 192, 256, 320, 384, 400]
    for n in sorted({m + d for m in runner.mixed_graphs.sizes for d in (-1, 0, 1)} - {401}):
        decodes = [Sequence([rng.randrange(256) for _ in range(rng.randrange(2, 300))])
                   for _ in range(rng.randrange(0, 6))]
        for seq in decodes:      # its prompt but the last token in the cache: a decode row's state
            llm.scheduler.block_manager.allocate(seq)
            runner.forward_logits(ScheduledBatch([seq], [len(seq) - 1]))
            seq.num_computed_tokens = len(seq) - 1
        chunked = n - len(decodes)                               # tokens of the prefill chunks
        cuts = sorted(rng.sample(range(1, chunked), min(rng.randrange(1, 32 - len(decodes)), chunked - 1)))
        lens = [b - a for a, b in zip([0] + cuts, cuts + [chunked])]
        seqs = [Sequence([rng.randrange(256) for _ in range(m + (i % 3 == 2))]) for i, m in enumerate(lens)]
        for seq in seqs:
            llm.scheduler.block_manager.allocate(seq)
        seqs = decodes + seqs    # every third chunk does not reach its end: nothing to sample
        batch = ScheduledBatch(seqs, [1] * len(decodes) + lens, num_decodes=len(decodes))
        assert runner._graphs_for(batch) is runner.mixed_graphs and batch.sample_rows
        graph_logits, rows = runner.forward_logits(batch)
        with torch.inference_mode():
            ids, positions, meta, eager_rows = runner.prepare(batch)
            with use_metadata(meta):
                hidden = runner.model(ids, positions)
            eager_logits = runner.model.compute_logits(hidden[runner._logit_positions(batch, meta)])
        assert rows == eager_rows == batch.sample_rows
        torch.testing.assert_close(graph_logits, eager_logits, atol=2e-3, rtol=2e-3)
        for seq in seqs:
            llm.scheduler.block_manager.deallocate(seq)


def test_eager_steps_queue_behind_the_step_in_flight(tmp_path):
    """A step over the mixed graphs' token limit runs eagerly but is launched like a graph step: its decode
    rows' input tokens are still in flight (placeholders gathered on the GPU). Eight sequences finish
    together and eight ~900-token prompts take their seats in one eager step; greedy ids equal the CPU's."""
    from nanovllm.engine.sequence import PLACEHOLDER
    make_tiny_model(str(tmp_path), num_heads=4, num_kv_heads=2, head_dim=64)
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in [20] * 16 + [rng.randrange(850, 950) for _ in range(8)]]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in [6] * 8 + [40] * 16]
    kw = dict(kvcache_block_size=16, max_model_len=1024, max_num_seqs=16, max_num_batched_tokens=8192)
    cpu = LLM(str(tmp_path), device="cpu", num_kvcache_blocks=1024, **kw).generate(prompts, params, use_tqdm=False)
    llm = LLM(str(tmp_path), device="cuda", num_kvcache_blocks=1024, **kw)
    runner, launched = llm.model_runner, []
    launch = runner.launch

    def spy(batch, prev):
        if runner._graphs_for(batch) is None:      # eager, launched without waiting
            launched.append(sum(seq.token_ids[-1] == PLACEHOLDER for seq in batch.seqs[:batch.num_decodes]))
        return launch(batch, prev)
    runner.launch = spy
    gpu = llm.generate(prompts, params, use_tqdm=False)
    assert [o["token_ids"] for o in gpu] == [o["token_ids"] for o in cpu]
    assert any(n >= 8 for n in launched), launched


def test_a_wider_block_table_compiles_no_kernel_again(tmp_path):
    """An eager step's block table is as wide as its longest sequence, and Triton compiles a kernel again
    when an integer argument turns into a multiple of 16: a run whose tables reached 16 blocks compiled the
    prefill, store and decode kernels again in its middle. Their table stride is not specialized."""
    from nanovllm.attention import triton_decode, triton_prefill, triton_store
    kernels = (triton_prefill._prefill_kernel, triton_store._store_window_kernel, triton_decode._decode_kernel)

    def compiled():       # Triton's in-memory cache of compiled variants, per kernel
        return [sum(len(caches[0]) for caches in fn.device_caches.values()) for fn in kernels]

    make_tiny_model(str(tmp_path), num_heads=4, num_kv_heads=2, head_dim=64)
    llm = LLM(str(tmp_path), device="cuda", enforce_eager=True, kvcache_block_size=16, max_model_len=512,
              num_kvcache_blocks=256)
    greedy_ids(llm, [[i % 256 for i in range(100)]], max_tokens=4)        # tables of 7 blocks
    before = compiled()
    assert all(before), before
    greedy_ids(llm, [[(7 * i + 3) % 256 for i in range(250)]], max_tokens=4)    # 16 blocks (no prefix hit)
    assert compiled() == before


def test_cascade_attention_gives_the_same_tokens(tmp_path, monkeypatch):
    """Requests behind one shared prefix, admitted a few at a time so that later ones hit the cached prefix
    blocks: with cascade attention (the prefix read once per step for its sharers) the greedy tokens equal
    those without, on graphs and eager; the plan did share blocks."""
    import nanovllm.engine.cuda_graph as cuda_graph
    import nanovllm.engine.model_runner as model_runner
    from nanovllm.attention.metadata import shared_prefix
    longest = []

    def spy(*args):
        plan = shared_prefix(*args)
        longest.append(plan[0])
        return plan

    monkeypatch.setattr(cuda_graph, "shared_prefix", spy)
    monkeypatch.setattr(model_runner, "shared_prefix", spy)
    make_tiny_model(str(tmp_path), num_heads=4, num_kv_heads=2, head_dim=64)
    rng = random.Random(3)
    prefix = [rng.randrange(256) for _ in range(40)]
    prompts = [prefix + [rng.randrange(256) for _ in range(rng.randrange(1, 20))] for _ in range(24)]
    kw = dict(device="cuda", kvcache_block_size=16, max_model_len=256, num_kvcache_blocks=256,
              max_num_batched_tokens=64, max_num_seqs=32)
    for eager in (False, True):
        plain = greedy_ids(LLM(str(tmp_path), enforce_eager=eager, enable_cascade_attention=False, **kw), prompts)
        longest.clear()
        cascade = LLM(str(tmp_path), enforce_eager=eager, **kw)     # on by default
        assert greedy_ids(cascade, prompts) == plain
        assert max(longest) == 32, eager


def test_dummy_qwen3_runs_on_gpu():
    from nanovllm.configs import shipped_config_dir
    llm = LLM(shipped_config_dir("Qwen3-0.6B"), load_format="dummy", max_model_len=2048, max_num_seqs=16,
              gpu_memory_utilization=0.5)
    assert llm.config.dtype == torch.bfloat16
    outs = llm.generate([[1, 2, 3] * 50] * 3, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    assert outs[0]["token_ids"] == outs[1]["token_ids"] == outs[2]["token_ids"]


def test_seeded_sampling_on_gpu_ignores_the_batch():
    llm = LLM(DEMO_MODEL_DIR, **DEMO_GPU)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=40, seed=3, ignore_eos=True)
    alone = llm.generate(["Now is"], seeded, use_tqdm=False)[0]["token_ids"]
    mixed = llm.generate(["Beautiful", "Now is", "Errors should"],
                         [SamplingParams(temperature=0.8, max_tokens=30), seeded,
                          SamplingParams(temperature=0, max_tokens=50)], use_tqdm=False)
    assert mixed[1]["token_ids"] == alone


def test_logprobs_on_gpu_match_cpu():
    params = SamplingParams(temperature=0, max_tokens=20, logprobs=3, prompt_logprobs=2)
    prompts = ["Beautiful is better than", "Errors should never"]
    cpu = LLM(DEMO_MODEL_DIR, device="cpu", max_model_len=1024).generate(prompts, params, use_tqdm=False)
    gpu = LLM(DEMO_MODEL_DIR, **DEMO_GPU).generate(prompts, params, use_tqdm=False)
    for c, g in zip(cpu, gpu):
        assert c["token_ids"] == g["token_ids"]
        for dc, dg in zip(c["logprobs"] + c["prompt_logprobs"][1:], g["logprobs"] + g["prompt_logprobs"][1:]):
            assert max(dc, key=dc.get) == max(dg, key=dg.get)
            # bf16 logits from other kernels: a few tenths apart where log-probabilities are far below zero
            assert all(abs(dc[t] - dg[t]) < 0.05 + 0.03 * abs(dc[t]) for t in set(dc) & set(dg)), (dc, dg)


def test_logits_processors_on_gpu_match_cpu():
    """Penalties, logit_bias, bad_words and min_tokens (steps not launched ahead: the processors read the
    tokens), beside plain requests in the same batch, give the CPU's greedy tokens."""
    prompts = ["Beautiful is better than", "Errors should never", "Special cases aren't", "Now is"]
    params = [SamplingParams(temperature=0, max_tokens=40, repetition_penalty=1.3, presence_penalty=0.5),
              SamplingParams(temperature=0, max_tokens=40, frequency_penalty=0.7, logit_bias={101: 3.0}),
              SamplingParams(temperature=0, max_tokens=40, bad_words=["is", "the"], min_tokens=30),
              SamplingParams(temperature=0, max_tokens=40)]
    cpu = LLM(DEMO_MODEL_DIR, device="cpu", max_model_len=1024).generate(prompts, params, use_tqdm=False)
    gpu = LLM(DEMO_MODEL_DIR, **DEMO_GPU).generate(prompts, params, use_tqdm=False)
    assert [o["token_ids"] for o in gpu] == [o["token_ids"] for o in cpu]


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_quantized_kv_on_gpu_equals_cpu_and_keeps_graphs(kv_cache_dtype):
    prompts = ["Beautiful is better than", "Errors should never", "Special cases aren't"]
    cpu = greedy_ids(LLM(DEMO_MODEL_DIR, device="cpu", max_model_len=1024, kv_cache_dtype=kv_cache_dtype), prompts, 60)
    gpu = LLM(DEMO_MODEL_DIR, kv_cache_dtype=kv_cache_dtype, **DEMO_GPU)
    assert gpu.model_runner.graphs is not None
    assert greedy_ids(gpu, prompts, 60) == cpu


def test_awq_on_gpu_equals_cpu(tmp_path):
    from awq.awq_models import make_awq_model
    make_awq_model(str(tmp_path), num_heads=8, num_kv_heads=2, head_dim=64)
    rng = random.Random(2)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (3, 20, 90)]
    kw = dict(kvcache_block_size=16, max_model_len=256, num_kvcache_blocks=64, dtype="float16", max_num_seqs=16)
    cpu = greedy_ids(LLM(str(tmp_path), device="cpu", **kw), prompts)
    assert greedy_ids(LLM(str(tmp_path), device="cuda", **kw), prompts) == cpu


def test_awq_greedy_ids_equal_with_and_without_pdl(tmp_path, monkeypatch):
    """Programmatic dependent launch changes when kernels start, never what they compute (utils/pdl.py)."""
    from awq.awq_models import make_awq_model

    from nanovllm.utils.pdl import pdl_launch
    make_awq_model(str(tmp_path), num_heads=8, num_kv_heads=2, head_dim=64)
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (1, 7, 40)]
    kw = dict(kvcache_block_size=16, max_model_len=256, num_kvcache_blocks=64, device="cuda", max_num_seqs=16)
    ids = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv("NANOVLLM_PDL", pdl)
        pdl_launch.cache_clear()                    # read once per process and device
        assert pdl_launch(torch.device("cuda", 0))["PDL"] == (pdl == "1" and torch.cuda.get_device_capability()[0] >= 9)
        ids[pdl] = greedy_ids(LLM(str(tmp_path), **kw), prompts, 48)
    pdl_launch.cache_clear()
    assert ids["1"] == ids["0"]


def test_speculative_decoding_on_gpu_gives_the_plain_greedy_tokens():
    """n-gram drafts verified in mixed-step CUDA graphs (and eagerly): the same greedy tokens as without."""
    prompts = ["Beautiful is better than ugly. Explicit is better than implicit. Beautiful is better than",
               "Errors should never pass silently. Errors should never", "Special cases aren't"]
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    plain = greedy_ids(LLM(DEMO_MODEL_DIR, **DEMO_GPU), prompts, 60)
    for eager in (False, True):
        llm = LLM(DEMO_MODEL_DIR, enforce_eager=eager, speculative_config=spec, **DEMO_GPU)
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=60), use_tqdm=False)
        assert [o["token_ids"] for o in outs] == plain
        assert sum(o["metrics"]["num_accepted_tokens"] for o in outs) > 0
        del llm
