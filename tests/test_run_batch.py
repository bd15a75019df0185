"""Batch files in, results out (issue 38): run_batch against LLM.generate on the demo model, resuming a
killed run, error lines for bad lines, the engine's output iterator, and Ray Data replicas."""
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.demo import DEMO_MODEL_DIR
from nanovllm.run_batch import main as run_batch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZEN = ["Beautiful is better than", "Explicit is better than", "Simple is better than", "Flat is better than",
       "Errors should never", "Now is better than", "Readability counts", "In the face of ambiguity"]


def request_lines(n: int, max_tokens: int = 12) -> list[dict]:
    lines = []
    for i in range(n):
        body = {"max_tokens": max_tokens, "temperature": 0}
        if i % 2:
            lines.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                          "body": {**body, "prompt": ZEN[i % len(ZEN)]}})
        else:
            lines.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {**body, "messages": [{"role": "user", "content": ZEN[i % len(ZEN)]}]}})
    return lines


def write_jsonl(path, records) -> str:
    with open(path, "w") as f:
        f.writelines((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)
    return str(path)


def read_results(path) -> dict[str, dict]:
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    counts = Counter(line["custom_id"] for line in lines)
    assert max(counts.values()) == 1, counts.most_common(3)          # every custom_id exactly once
    return {line["custom_id"]: line for line in lines}


def text_of(line: dict) -> str:
    choice = line["response"]["body"]["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.fixture(scope="module")
def llm():
    return LLM(DEMO_MODEL_DIR, max_model_len=256)


def test_results_equal_generate(tmp_path, llm):
    records = request_lines(8)
    out = tmp_path / "out.jsonl"
    run_batch(["-i", write_jsonl(tmp_path / "in.jsonl", records), "-o", str(out), "--model", DEMO_MODEL_DIR,
               "--max-model-len", "256", "--disable-progress-bar"])
    results = read_results(out)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template(r["body"]["messages"], tokenize=False, add_generation_prompt=True)
               if "messages" in r["body"] else r["body"]["prompt"] for r in records]
    want = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    for record, expected in zip(records, want):
        line = results[record["custom_id"]]
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert text_of(line) == expected.outputs[0].text
        usage = line["response"]["body"]["usage"]
        assert usage["completion_tokens"] == len(expected.outputs[0].token_ids)
        assert usage["prompt_tokens"] == len(expected.prompt_token_ids)


def test_bad_lines_get_error_lines_and_the_rest_run(tmp_path):
    good = request_lines(2)
    bad = ["not json", {"custom_id": "u", "method": "POST", "url": "/v1/embeddings", "body": {}},
           {"custom_id": "f", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "bogus": 1}},
           {"custom_id": "t", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x " * 400}},
           {"custom_id": "p", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "top_p": 7}},
           {**good[0], "body": {**good[0]["body"], "max_tokens": 3}}]              # a repeated custom_id
    out = tmp_path / "out.jsonl"
    run_batch(["-i", write_jsonl(tmp_path / "in.jsonl", good + bad), "-o", str(out), "--model", DEMO_MODEL_DIR,
               "--max-model-len", "256", "--disable-progress-bar"])
    with open(out) as f:
        lines = [json.loads(line) for line in f]
    errors = {line["custom_id"]: line["error"] for line in lines if line["error"]}
    assert errors["line-3"]["code"] == "invalid_request" and "not valid JSON" in errors["line-3"]["message"]
    assert errors["u"]["code"] == "unknown_url" and "/v1/completions" in errors["u"]["message"]
    assert "bogus" in errors["f"]["message"] and "top_p" in errors["p"]["message"]
    assert "max_model_len" in errors["t"]["message"]
    assert errors["r0"]["code"] == "duplicate_custom_id"
    ok = [line for line in lines if line["error"] is None]
    assert sorted(line["custom_id"] for line in ok) == ["r0", "r1"]
    assert all(line["response"] is None for line in lines if line["error"])


def test_a_killed_run_resumes_with_every_custom_id_once(tmp_path):
    records = request_lines(24, max_tokens=32)
    src, out = write_jsonl(tmp_path / "in.jsonl", records), tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "nanovllm.run_batch", "-i", src, "-o", str(out), "--model", DEMO_MODEL_DIR,
           "--max-model-len", "256", "--max-num-seqs", "2", "--disable-progress-bar"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = out.read_text().count("\n")
    assert 5 <= written < len(records), f"the run was not stopped mid-file ({written} lines)"
    with open(out, "a") as f:
        f.write('{"id": "batch_req_cut", "custom_id": "r3')            # a line cut short by the kill
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    resumed = read_results(out)
    assert set(resumed) == {r["custom_id"] for r in records}
    clean = tmp_path / "clean.jsonl"
    subprocess.run(cmd[:6] + [str(clean)] + cmd[7:], cwd=ROOT, env=env, check=True, capture_output=True,
                   timeout=300)
    assert {k: text_of(v) for k, v in resumed.items()} == {k: text_of(v) for k, v in read_results(clean).items()}


def test_output_iterator_feeds_lazily_and_an_early_stop_frees_everything(llm):
    params = SamplingParams(temperature=0, max_tokens=8)
    requests = ((i, ZEN[i % len(ZEN)], params) for i in range(30))
    waiting_seen = []
    original_step = llm.step

    def step():
        waiting_seen.append(len(llm.scheduler.waiting))
        return original_step()

    llm.step = step
    try:
        got = []
        for key, output in llm.iter_outputs(requests, max_waiting=3):
            got.append(key)
            if len(got) == 10:
                break
    finally:
        del llm.step
    assert len(got) == 10 and max(waiting_seen) <= 3
    assert llm.scheduler.is_finished()
    manager = llm.scheduler.block_manager
    assert manager.num_free_blocks == len(manager.blocks)
    keys = [k for k, _ in llm.iter_outputs(((i, ZEN[0], params) for i in range(5)))]
    assert sorted(keys) == list(range(5))


def test_two_ray_replicas_give_what_one_process_gives(tmp_path, monkeypatch):
    pytest.importorskip("ray.data")
    from nanovllm.batch import ray_data
    monkeypatch.setattr(ray_data, "LINES_PER_BATCH", 4)          # 13 lines: both replicas get some
    records = request_lines(12)
    src = write_jsonl(tmp_path / "in.jsonl", records + ["not json"])
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    common = ["--model", DEMO_MODEL_DIR, "--max-model-len", "256", "--disable-progress-bar", "--device", "cpu"]
    run_batch(["-i", src, "-o", str(one), *common])
    run_batch(["-i", src, "-o", str(two), "--replicas", "2", *common])
    a, b = read_results(one), read_results(two)
    assert set(a) == set(b) == {r["custom_id"] for r in records} | {"line-13"}
    assert {k: text_of(v) for k, v in a.items() if v["error"] is None} == \
        {k: text_of(v) for k, v in b.items() if v["error"] is None}


def test_the_readme_example_file_runs(tmp_path):
    out = tmp_path / "results" / "batch.jsonl"          # a folder that does not exist yet
    run_batch(["-i", os.path.join(ROOT, "nanovllm", "demo", "batch_example.jsonl"), "-o", str(out), "--model",
               DEMO_MODEL_DIR, "--max-model-len", "256", "--disable-progress-bar"])
    results = read_results(out)
    assert len(results) == 4 and all(line["error"] is None for line in results.values())
    assert len(results["completion-1"]["response"]["body"]["choices"]) == 2            # n = 2


def test_logprobs_come_back_in_openai_shapes(tmp_path, llm):
    chat = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": ZEN[0]}], "max_tokens": 5, "temperature": 0,
                     "logprobs": True, "top_logprobs": 2}}
    completion = {"custom_id": "p", "method": "POST", "url": "/v1/completions",
                  "body": {"prompt": ZEN[1], "max_tokens": 5, "temperature": 0, "logprobs": 3}}
    out = tmp_path / "out.jsonl"
    run_batch(["-i", write_jsonl(tmp_path / "in.jsonl", [chat, completion]), "-o", str(out), "--model",
               DEMO_MODEL_DIR, "--max-model-len", "256", "--disable-progress-bar"])
    results = read_results(out)
    content = results["c"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and all(len(item["top_logprobs"]) == 2 for item in content)
    for item in content:      # greedy: the chosen token is the most likely one, and logprobs are <= 0
        assert item["logprob"] <= 0 and item["top_logprobs"][0]["logprob"] == pytest.approx(item["logprob"])
        assert bytes(item["bytes"]) == item["token"].encode()
    text = results["p"]["response"]["body"]["choices"][0]
    logprobs = text["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 5
    assert all(len(top) <= 3 for top in logprobs["top_logprobs"])
    assert logprobs["text_offset"][0] == 0 and "".join(logprobs["tokens"]) == text["text"]
    want = llm.generate(ZEN[1], SamplingParams(temperature=0, max_tokens=5, logprobs=3), use_tqdm=False)[0]
    assert logprobs["token_logprobs"] == pytest.approx([d[t] for d, t in zip(want["logprobs"], want["token_ids"])])
