"""The attention kernels compile for Hopper (sm_90) at a real head size, checked on CPU.

The suite runs Triton kernels in the interpreter, which executes only the branches a launch takes: a branch
that never runs on CPU is never type-checked. A store in the decode kernel's write-the-output branch had the
wrong shape in cascade's shared-prefix mode (its rows are a vector there) whenever head_dim differed from the
64-pair tile, so every GPU decode with cascade on failed to compile, while all CPU tests passed. Here the
launches of a few calls at head_dim 128 are recorded in the interpreter, then compiled for sm_90 in a process
without it (Triton compiles for a GPU it does not have).
"""
import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

POINTEE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
           torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8", torch.float8_e4m3fn: "fp8e4nv"}


def describe(fn, args, kwargs) -> dict:
    """A launch as triton.compile takes it: argument types, constexpr values, warps and stages."""
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    kwargs = {k: v for k, v in kwargs.items() if k not in ("num_ctas", "launch_pdl")}
    types, constexprs = {}, {}
    signature = inspect.signature(fn)
    bound = signature.bind_partial(*args, **kwargs).arguments
    for name, param in signature.parameters.items():
        value = bound.get(name, param.default)
        if "constexpr" in str(param.annotation) or value is None:
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            types[name] = "*" + POINTEE[value.dtype]
        else:
            types[name] = {bool: "i1", int: "i32", float: "fp32"}[type(value)]
    return {"module": fn.__module__, "name": fn.__name__, "types": types, "constexprs": constexprs,
            "options": options}


@pytest.fixture
def launches(monkeypatch):
    """Records every interpreted kernel launch (the kernels still run)."""
    from triton.runtime.interpreter import InterpretedFunction
    seen, run = [], InterpretedFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        seen.append(describe(self.fn, args, dict(kwargs)))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)
    monkeypatch.setattr(InterpretedFunction, "run", record)
    return seen


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile these kernels for their own GPU")
def test_attention_kernels_compile_for_hopper_at_head_dim_128(launches, tmp_path):
    from attention_cases import make_case

    from nanovllm.attention.metadata import shared_prefix
    from nanovllm.attention.triton_decode import decode_attention
    from nanovllm.attention.triton_prefill import prefill_attention
    contexts, block_size = [40, 33, 70, 35], 16
    for kv in ("auto", "int8", "fp8"):
        q, cache, meta = make_case([1] * 4, contexts, 4, 2, 128, block_size, torch.bfloat16, "cpu", kv_cache_dtype=kv)
        meta.block_tables[[0, 2, 3], :2] = meta.block_tables[0, :2].clone()     # rows 0, 2, 3 share 2 blocks
        shared = torch.tensor(shared_prefix(meta.block_tables.tolist(), contexts, block_size), dtype=torch.int32)
        decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, 1, shared=shared)   # cascade
        decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, 2)                   # splits
        q, cache, meta = make_case([5, 3], [9, 20], 4, 2, 128, block_size, torch.bfloat16, "cpu", kv_cache_dtype=kv)
        prefill_attention(q, cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q, meta.max_seqlen_q, 0.1)
    unique = list({json.dumps(launch, sort_keys=True): launch for launch in launches}.values())
    assert {launch["constexprs"].get("SHARED") for launch in unique} >= {True, False}
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(unique))
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), str(path)], env=env, cwd=root,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == f"{len(unique)} compiled"


def compile_all(path: str) -> None:
    """Compiles each recorded launch for sm_90; prints what failed, exits 1 if anything did."""
    import importlib

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    failed = 0
    for launch in json.load(open(path)):
        fn = getattr(importlib.import_module(launch["module"]), launch["name"])
        signature = {name: launch["types"].get(name, "constexpr") for name in fn.arg_names}
        try:
            triton.compile(ASTSource(fn=fn, signature=signature, constexprs=launch["constexprs"]),
                           target=GPUTarget("cuda", 90, 32), options=launch["options"])
        except Exception as e:  # noqa: BLE001 - each failure is reported with its launch
            failed += 1
            print(launch["name"], launch["constexprs"], launch["options"], str(e).strip().splitlines()[-1])
    print(f"{failed} failed" if failed else f"{len(json.load(open(path)))} compiled")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    compile_all(sys.argv[1])
