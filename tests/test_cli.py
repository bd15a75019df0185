"""Every command-line tool answers a bad argument with a one-line usage error and exit code 2, never a
traceback (issue 43)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD = [
    ["example.py", "/nonexistent"],
    ["bench.py", "--workload", "nope"],
    ["bench_sharegpt.py", "--num-prompts", "-3"],
    ["-m", "nanovllm.tools.perplexity", "--model", "/nonexistent", "--text", "README.md"],
    ["-m", "nanovllm.tools.perplexity", "--model", "nanovllm/demo/zen-qwen3", "--text", "missing.txt"],
    ["-m", "nanovllm.quant.awq_quantize", "--model", "/nonexistent", "--out", "/tmp/nanovllm-cli-test-out"],
    ["-m", "nanovllm.tools.decode_profile", "--num-seqs", "0"],
    ["-m", "nanovllm.tools.render_results", "--root", "/nonexistent"],
    ["-m", "nanovllm.run_batch", "-i", "/nonexistent.jsonl", "-o", "-", "--model", "nanovllm/demo/zen-qwen3"],
    ["-m", "nanovllm.run_batch", "-i", "README.md", "-o", "-", "--model", "/nonexistent"],
    ["benchmarks/bench_spec.py", "--model", "/nonexistent"],
    ["benchmarks/quality_table.py", "--model", "/nonexistent"],
]


@pytest.mark.parametrize("args", BAD, ids=[" ".join(a[:2]) for a in BAD])
def test_a_bad_argument_is_a_usage_error(args):
    run = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-1500:]
    assert "Traceback" not in run.stderr and "error:" in run.stderr.strip().splitlines()[-1]
