"""The repository's scripts run end to end on CPU: regression_test.sh and bench_sharegpt.py."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("case", "ABCDEFGH")
def test_every_regression_case_passes(case):
    """Each case in this process (a process per case, as the script runs them, spends most of its time importing
    torch); the script itself is run below on two cases."""
    from nanovllm.tools.regression import CASES
    assert isinstance(CASES[case](), dict)     # a failed check raises Fail with its reason


def test_regression_script_reports_passing_cases(tmp_path):
    env = dict(os.environ, NANOVLLM_REGRESSION_OUT=str(tmp_path))     # keep the committed results as they are
    out = subprocess.run(["bash", "regression_test.sh", "D", "G"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "2 passed, 0 failed, 0 skipped"
    assert [line[:8] for line in lines[:-1]] == ["[PASS] D", "[PASS] G"]
    assert sorted(os.listdir(tmp_path)) == ["case_D.json", "case_G.json"]


def test_regression_script_reports_a_failure(tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")             # the case cannot write its JSON there: it crashes after running
    out = subprocess.run(["bash", "regression_test.sh", "H"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, NANOVLLM_REGRESSION_OUT=str(blocked)))
    lines = out.stdout.strip().splitlines()
    assert out.returncode != 0 and lines[-1] == "0 passed, 1 failed, 0 skipped", out.stdout
    assert lines[0].startswith("[FAIL] H")


def test_bench_sharegpt_compares_configs(tmp_path):
    out_file = tmp_path / "sg.json"
    subprocess.run([sys.executable, "bench_sharegpt.py", "--model", "nanovllm/demo/zen-qwen3", "--num-prompts", "2",
                    "--max-model-len", "512", "--configs", "bf16", "int8", "--out", str(out_file)], cwd=ROOT,
                   check=True, capture_output=True, timeout=600)
    result = json.loads(out_file.read_text())
    bf16, int8 = result["configs"]
    assert bf16["num_requests"] == int8["num_requests"] == 2
    assert bf16["output_tokens"] == int8["output_tokens"]       # reply lengths, forced with ignore_eos
    assert int8["kv_capacity_tokens"] > 1.7 * bf16["kv_capacity_tokens"]
    assert 0 < bf16["ttft_mean_s"] <= bf16["ttft_p99_s"] and 0 < bf16["tpot_mean_s"]


def test_readme_tables_come_from_the_json(tmp_path):
    """README gets the newest figure per GPU, workload and KV dtype; benchmark_results/README.md every row
    with its file (rendered here into a copy of the folder: a test never writes into the tree)."""
    import shutil

    from nanovllm.tools.render_results import END, START, render
    root = tmp_path / "benchmark_results"
    shutil.copytree(os.path.join(ROOT, "benchmark_results"), root, ignore=shutil.ignore_patterns("*.png"))
    (root / "README.md").unlink(missing_ok=True)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{START}\nstale\n{END}\noutro\n")
    render(str(readme), str(root))
    text = readme.read_text()
    assert "stale" not in text and text.startswith("intro") and text.endswith("outro\n")
    with open(root / "bench" / "nanovllm-Qwen3-0.6B-auto-tp1.json") as f:
        record = json.load(f)
    assert f"| NVIDIA H200 | random | auto | {record['tokens_per_s']:,.0f} |" in text
    full = (root / "README.md").read_text()
    assert "bench/hf-Qwen3-0.6B-auto-tp1.json`" in full and "| hf | random |" in full


def test_bench_runs_and_records_the_floor(tmp_path):
    from tiny_models import make_tiny_model
    make_tiny_model(str(tmp_path / "tiny"))
    os.remove(tmp_path / "tiny" / "model.safetensors")          # a config alone: random weights ("dummy")
    out_file = tmp_path / "bench.json"
    subprocess.run([sys.executable, "bench.py", "--model", str(tmp_path / "tiny"), "--num-seqs", "2",
                    "--max-input-len", "100", "--max-output-len", "100", "--max-model-len", "256", "--repeat", "3",
                    "--out", str(out_file)], cwd=ROOT, check=True, capture_output=True, timeout=600)
    record = json.loads(out_file.read_text())
    assert record["output_tokens"] == 200 and record["load_format"] == "dummy"
    assert len(record["runs_seconds"]) == 3 and sorted(record["runs_seconds"])[1] == round(record["seconds"], 3)
    assert record["step_stats"] in record["runs_step_stats"] and len(record["runs_step_stats"]) == 3
    assert record["workload"] == "random" and record["floor"]["floor_s"] > 0 and record["seconds_over_floor"] > 1
    assert record["floor"]["min_steps"] == 100 and record["step_stats"]["prefill_steps"] == 1


def test_bench_admits_in_waves_when_asked(tmp_path):
    """--admission-wave 1: newcomers only once every seat is free, so no step mixes decodes and prefill."""
    from tiny_models import make_tiny_model
    make_tiny_model(str(tmp_path / "tiny"))
    out_file = tmp_path / "bench.json"
    subprocess.run([sys.executable, "bench.py", "--model", str(tmp_path / "tiny"), "--num-seqs", "6",
                    "--max-num-seqs", "2", "--max-input-len", "100", "--max-output-len", "100",
                    "--max-model-len", "256", "--admission-wave", "1", "--out", str(out_file)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    record = json.loads(out_file.read_text())
    stats = record["step_stats"]
    assert record["settings"]["admission_wave"] == 1 and record["output_tokens"] > 0
    assert stats["mixed_steps"] == 0 and stats["prefill_steps"] == 3, stats   # three waves of two


def test_floor_counts_the_weights_a_token_reads(monkeypatch):
    """bench.active_params: every weight of a dense model but the embedding; an MoE layer's router and top_k
    experts only (Qwen3-30B-A3B: about 3B of its 30B, as its name says)."""
    monkeypatch.syspath_prepend(ROOT)
    from bench import active_params
    from nanovllm.config import load_hf_config
    from nanovllm.configs import shipped_config_dir
    dense = load_hf_config(shipped_config_dir("Qwen3-0.6B"))
    per_layer = dense.hidden_size * dense.head_dim * (2 * dense.num_attention_heads + 2 * dense.num_key_value_heads) \
        + 3 * dense.hidden_size * dense.intermediate_size
    assert active_params(dense) == dense.num_hidden_layers * per_layer + dense.hidden_size * dense.vocab_size
    moe = load_hf_config(shipped_config_dir("Qwen3-30B-A3B"))
    active = active_params(moe)
    assert 2.9e9 < active < 3.2e9
    moe.intermediate_size *= 100          # the dense MLP size plays no part where every layer is sparse
    assert active_params(moe) == active
    moe.mlp_only_layers = [0]             # ...until a layer is dense
    assert active_params(moe) > active


def test_host_step_benchmark_runs_the_engine_without_a_gpu(tmp_path):
    """benchmarks/bench_host_step.py drives the engine's own host code (scheduler, graph-input staging, stop
    checks) to the end of the short workload, through mixed and decode steps."""
    out_file = tmp_path / "host.json"
    subprocess.run([sys.executable, "benchmarks/bench_host_step.py", "--workload", "short", "--out", str(out_file)],
                   cwd=ROOT, check=True, capture_output=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    result = json.loads(out_file.read_text())
    assert result["steps"]["mixed"] > 100 and result["steps"]["decode"] > 100
    assert result["host_ms_per_step"]["mixed"] > 0
    for kind in ("mixed", "decode"):     # llm.stats' launch time: part of the step's host time
        assert 0 < result["launch_ms_per_step"][kind] < result["host_ms_per_step"][kind]


def test_step_profile_reports_the_admission_phase_apart(monkeypatch):
    """bench.py --profile: the steps while requests wait (prefill and mixed) get their own kernel list and
    idle fraction, and the overall figures add both phases' windows (a fake profiler: 1 ms of kernel per
    step, 1 ms apart in admission, back to back after it)."""
    import contextlib
    import types

    import torch

    from nanovllm.tools import decode_profile

    clock, recorded = {"t": 0.0}, {"events": []}

    class FakeEngine:
        def __init__(self):
            self.scheduler = types.SimpleNamespace(waiting=[1, 2, 3], is_finished=lambda: False)

        def step(self):
            admitting = bool(self.scheduler.waiting)
            if admitting:
                self.scheduler.waiting.pop()
            name = "prefill_kernel" if admitting else "decode_kernel"
            start = clock["t"]
            clock["t"] += 2000.0 if admitting else 1000.0
            recorded["events"].append(types.SimpleNamespace(device_type=torch.autograd.DeviceType.CUDA, name=name,
                                                  time_range=types.SimpleNamespace(start=start, end=start + 1000.0)))

    @contextlib.contextmanager
    def fake_profile(activities):
        events = recorded["events"] = []        # each profile keeps its own events
        yield types.SimpleNamespace(events=lambda: events)

    monkeypatch.setattr(decode_profile, "profile", fake_profile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    result = decode_profile.profile_steps(FakeEngine(), steps=10)
    assert result["steps"] == 10
    assert result["admission"]["steps"] == 3
    assert result["admission"]["top_kernels_ms_per_step"] == {"prefill_kernel": 1.0}
    assert result["admission"]["idle_fraction"] == round(1 - 3000 / 5000, 4)   # 3 kernels over a 5 ms window
    assert result["top_kernels_ms_per_step"] == {"decode_kernel": 0.7, "prefill_kernel": 0.3}
    assert result["idle_fraction"] == round(1 - 10000 / (5000 + 7000), 4)
    assert result["admission"]["stall_fraction"] == round(2000 / 5000, 4)   # the two 1 ms gaps
    assert result["stall_fraction"] == round(2000 / (5000 + 7000), 4)       # the decode kernels: back to back


def test_stalls_are_the_long_gaps_between_kernels():
    """Gaps shorter than STALL_US are launch gaps inside a step; longer ones, and only they, are stalls
    (overlapping spans leave no gap)."""
    from nanovllm.tools.decode_profile import stall_length, union_length

    spans = [(0.0, 10.0), (12.0, 20.0), (15.0, 30.0), (80.0, 90.0), (109.0, 120.0), (150.0, 151.0)]
    assert stall_length(spans, threshold_us=20.0) == (80.0 - 30.0) + (150.0 - 120.0)
    assert stall_length(spans, threshold_us=5.0) == 50.0 + 19.0 + 30.0
    assert union_length(spans) == 10.0 + 18.0 + 10.0 + 11.0 + 1.0
