"""Every command-line tool answers a bad argument with a one-line usage error and exit code 2, never a
traceback (issue 43). The tools run in this process (as `python -m` / `python script.py` would run them, via
runpy): a process per tool would spend its time importing torch again."""
import contextlib
import io
import os
import runpy
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


def run_tool(args: list[str], monkeypatch) -> tuple[int, str]:
    """Run `python ARGS` here: its exit code and what it wrote to stderr. Any exception but SystemExit (what
    would be a traceback in a process of its own) propagates and fails the test."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", [ROOT, *sys.path])
    module = args[1] if args[0] == "-m" else None
    argv = args[2:] if module else args[1:]
    monkeypatch.setattr(sys, "argv", [module or args[0], *argv])
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit_:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(args[0], run_name="__main__")
    return exit_.value.code, stderr.getvalue()


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")   # runpy on an imported module
@pytest.mark.parametrize("args", BAD, ids=[" ".join(a[:2]) for a in BAD])
def test_a_bad_argument_is_a_usage_error(args, monkeypatch):
    code, err = run_tool(args, monkeypatch)
    assert code == 2, err[-1500:]
    assert "Traceback" not in err and "error:" in err.strip().splitlines()[-1]
