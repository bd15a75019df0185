"""An interrupted or failing generate leaves the engine as it was (issue 44, F1/F2): bad requests are
refused before anything is queued or become error outputs, an exception in the step loop aborts the
call's own requests and frees their blocks, and the next call equals a fresh engine's."""
import os

import numpy as np
import pytest
from tiny_models import make_tiny_model

from nanovllm import LLM, SamplingParams

KW = dict(kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256)
PROMPTS = [[1, 2, 3, 4, 5], list(range(40, 75)), [7] * 20]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("reliability"))
    make_tiny_model(path)
    return path


def greedy(llm, prompts=PROMPTS, **kw):
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False, **kw)
    return [o["token_ids"] for o in outs]


def assert_idle(llm):
    """Queues empty, nothing in flight, every block free."""
    assert not llm.scheduler.running and not llm.scheduler.waiting and llm.pending is None
    assert llm.scheduler.block_manager.num_free_blocks == KW["num_kvcache_blocks"]


@pytest.fixture(scope="module")
def fresh(model_dir):
    return greedy(LLM(model_dir, **KW))


@pytest.mark.parametrize("bad", [None, {"text": "hi"}, 3.5, [1, None, 2], [1, 2.5], "ok \ud800"])
def test_a_bad_prompt_is_an_error_output_and_the_others_run(model_dir, fresh, bad):
    llm = LLM(model_dir, **KW)
    outs = llm.generate(PROMPTS[:1] + [bad] + PROMPTS[1:], SamplingParams(temperature=0, max_tokens=12,
                                                                            ignore_eos=True), use_tqdm=False)
    assert outs[1]["finish_reason"] == "error" and outs[1]["error"]
    assert [o["token_ids"] for o in outs[:1] + outs[2:]] == fresh
    assert_idle(llm)
    assert greedy(llm) == fresh


@pytest.mark.parametrize("params", [{"temperature": 0}, ("a",), [SamplingParams(), None, SamplingParams()], [],
                                    [SamplingParams()] * 2])
def test_bad_sampling_params_raise_before_anything_is_queued(model_dir, fresh, params):
    llm = LLM(model_dir, **KW)
    with pytest.raises((TypeError, ValueError), match="SamplingParams"):
        llm.generate(PROMPTS, params, use_tqdm=False)
    assert_idle(llm)
    assert greedy(llm) == fresh


def test_numpy_token_ids_are_integers(model_dir, fresh):
    llm = LLM(model_dir, **KW)
    assert greedy(llm, [np.array(p) for p in PROMPTS]) == fresh
    assert greedy(llm, [[np.int64(t) for t in p] for p in PROMPTS]) == fresh


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
@pytest.mark.parametrize("at_step", [0, 1, 5])
def test_an_exception_in_the_step_loop_aborts_the_call(model_dir, fresh, error, at_step):
    llm = LLM(model_dir, max_num_batched_tokens=16, **KW)     # chunked prompts: blocks held mid-prompt
    run, calls = llm.model_runner.run, [0]

    def failing(batch, *args):
        calls[0] += 1
        if calls[0] > at_step:
            raise error("interrupted")
        return run(batch, *args)

    llm.model_runner.run = failing
    with pytest.raises(error):
        greedy(llm)
    assert_idle(llm)
    llm.model_runner.run = run
    assert greedy(llm) == fresh


def test_seeds_beyond_64_bits_are_refused():
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**70)
    SamplingParams(seed=2**64 - 1)


@pytest.mark.parametrize("at_launch", [1, 4])
def test_an_interrupt_with_a_step_in_flight_drains_it_and_frees_everything(model_dir, at_launch):
    """Overlapped steps (a fake runner standing in for the GPU, as in test_overlap.py): the step in flight
    is collected before the call's requests are aborted."""
    from test_overlap import FakeRunner
    llm = LLM(model_dir, **KW)
    llm.model_runner = runner = FakeRunner(overlap=True)
    expected = greedy(llm)
    launch = runner.launch

    def failing(batch, prev):
        if runner.num_launches >= at_launch:
            raise KeyboardInterrupt
        return launch(batch, prev)

    runner.launch = failing
    with pytest.raises(KeyboardInterrupt):
        greedy(llm)
    assert_idle(llm)
    runner.launch = launch
    assert greedy(llm) == expected


@pytest.mark.parametrize("where", ["same", "inside", "around"])
def test_the_quantizer_refuses_to_write_over_its_input(model_dir, tmp_path, where):
    import os

    from nanovllm.quant.awq_quantize import quantize_checkpoint
    out = {"same": model_dir, "inside": os.path.join(model_dir, "awq"),
           "around": os.path.dirname(model_dir)}[where]
    before = {n: os.path.getmtime(os.path.join(model_dir, n)) for n in os.listdir(model_dir)}
    with pytest.raises(ValueError, match="must not be the model directory"):
        quantize_checkpoint(model_dir, out)
    assert {n: os.path.getmtime(os.path.join(model_dir, n)) for n in os.listdir(model_dir)} == before


@pytest.mark.parametrize("kw", [dict(group_size=0), dict(group_size=12), dict(calib_tokens=-5)])
def test_the_quantizer_checks_its_settings_first(model_dir, tmp_path, kw):
    from nanovllm.quant.awq_quantize import quantize_checkpoint
    with pytest.raises(ValueError):
        quantize_checkpoint(model_dir, str(tmp_path / "out"), **kw)
    assert not (tmp_path / "out").exists()


def test_the_quantizer_names_the_group_sizes_a_model_takes(model_dir, tmp_path):
    """A group wider than a layer's input (the tiny model's hidden size is 64) fails before anything is read
    or written, naming the layer widths and group sizes that fit."""
    from nanovllm.quant.awq_quantize import quantize_checkpoint
    with pytest.raises(ValueError, match=r"--group-size 128 must divide .*q/k/v/gate/up_proj 64.*takes .*64"):
        quantize_checkpoint(model_dir, str(tmp_path / "out"), group_size=128)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [None, '{"ids": [1, 2]}', "[1.5, 2]", "[1, 99999999]", "[]", "[1, 2",
                                     "", b"\xff\xfe\x00bad"])
def test_the_quantizer_says_what_calibration_input_it_takes(model_dir, tmp_path, content):
    """Bad --calib input (missing, JSON that is no list of ids, ids outside the vocabulary, no tokens, not
    UTF-8) is a ValueError naming --calib, and nothing is written."""
    from nanovllm.quant.awq_quantize import quantize_checkpoint
    suffix = ".txt" if content in ("", b"\xff\xfe\x00bad") else ".json"
    calib = tmp_path / f"calib{suffix}"
    if isinstance(content, bytes):
        calib.write_bytes(content)
    elif content is not None:
        calib.write_text(content)
    with pytest.raises(ValueError, match="--calib"):
        quantize_checkpoint(model_dir, str(tmp_path / "out"), method="rtn", group_size=32, calib=str(calib))
    assert not (tmp_path / "out").exists()


def test_perplexity_cli_defaults_on_the_demo_model_and_a_long_text(tmp_path):
    """F6: the default --max-len (1,024) is over the demo model's positions; the CLI uses what fits."""
    import json
    import subprocess
    import sys
    text = tmp_path / "long.txt"
    text.write_text("Beautiful is better than ugly. Explicit is better than implicit. " * 40)   # > 1,024 bytes
    out = tmp_path / "ppl.json"
    run = subprocess.run([sys.executable, "-m", "nanovllm.tools.perplexity", "--model", "nanovllm/demo/zen-qwen3",
                          "--text", str(text), "--out", str(out)], capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["num_windows"] > 1 and record["perplexity"] > 1
    bad = subprocess.run([sys.executable, "-m", "nanovllm.tools.perplexity", "--model", "nanovllm/demo/zen-qwen3",
                          "--text", str(text), "--max-len", "1", "--out", str(out)], capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert bad.returncode == 2 and "--max-len must be >= 2" in bad.stderr


def test_an_engine_takes_no_request_after_shutdown(model_dir):
    """F3: after shutdown() (which ends tensor-parallel workers) a call raises instead of running rank 0
    alone."""
    llm = LLM(model_dir, **KW)
    llm.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        greedy(llm)
    assert_idle(llm)


@pytest.mark.parametrize("messages", [[{"role": "wizard", "content": "hi"}], [{"content": "hi"}],
                                      [{"role": "user"}], [{"role": "user", "content": None}], [[]]])
def test_chat_refuses_malformed_messages_before_anything_is_queued(model_dir, messages):
    llm = LLM(model_dir, **KW)
    with pytest.raises(ValueError, match="message|conversation"):
        llm.chat(messages, SamplingParams(max_tokens=2), use_tqdm=False)
    assert_idle(llm)


@pytest.mark.parametrize("kw", [dict(max_num_batched_tokens="100"), dict(kvcache_block_size=16.0),
                                dict(seed=None), dict(max_num_seqs=2.5)])
def test_settings_of_the_wrong_type_fail_when_the_engine_is_made(model_dir, kw):
    with pytest.raises(ValueError, match="must be an integer"):
        LLM(model_dir, **(KW | kw))


def test_clipping_max_model_len_is_logged(model_dir, caplog, monkeypatch):
    import logging
    monkeypatch.setattr(logging.getLogger("nanovllm"), "propagate", True)   # to caplog's root handler
    llm = LLM(model_dir, **(KW | dict(max_model_len=10**6)))
    assert llm.config.max_model_len == 1024 and "max_position_embeddings" in caplog.text


def test_a_tied_config_with_its_own_lm_head_uses_it_as_transformers_does(tmp_path):
    """F7: config.json says tie_word_embeddings, the checkpoint still holds a different lm_head.weight:
    transformers keeps them apart (and warns); the greedy tokens equal transformers'."""
    import json

    from tiny_models import hf_greedy
    from transformers import AutoModelForCausalLM
    make_tiny_model(str(tmp_path), tie=False)
    config = json.loads((tmp_path / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype="float32").eval()
    assert not hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    llm = LLM(str(tmp_path), **KW)
    assert greedy(llm) == [hf_greedy(hf, p, 12) for p in PROMPTS]


def test_a_tensor_parallel_script_without_a_main_guard_fails_fast(tmp_path):
    """F4: spawned workers import the script; without `if __name__ == '__main__':` they die at start. Rank 0
    notices at once and says why, instead of waiting out the 10-minute rendezvous."""
    import subprocess
    import sys
    import time
    script = tmp_path / "no_guard.py"
    script.write_text("from nanovllm import LLM\n"
                      "LLM('nanovllm/demo/zen-qwen3', tensor_parallel_size=2, device='cpu', max_model_len=128)\n")
    start = time.monotonic()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=root,
                         env=env)
    assert run.returncode != 0 and time.monotonic() - start < 120
    assert "__main__" in run.stderr and "exited with code" in run.stderr, run.stderr[-2000:]
