"""The attention, norm, RoPE and MoE kernels compile for Hopper (sm_90) at real head sizes, checked on CPU.

The suite runs Triton kernels in the interpreter, which executes only the branches a launch takes: a branch
that never runs on CPU is never type-checked. A store in the decode kernel's write-the-output branch had the
wrong shape in cascade's shared-prefix mode (its rows are a vector there) whenever head_dim differed from the
64-pair tile, so every GPU decode with cascade on failed to compile, while all CPU tests passed. Here the
launches of a few calls at head_dim 128 (64 too for RoPE) are recorded in the interpreter, then compiled for sm_90
in a process without it (Triton compiles for a GPU it does not have).
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
@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # interpreted bf16 norms overflow; only launches matter
def test_kernels_compile_for_hopper_at_real_head_dims(launches, tmp_path):
    from attention_cases import make_case

    from nanovllm.attention.metadata import shared_prefix
    from nanovllm.attention.triton_decode import decode_attention
    from nanovllm.attention.triton_prefill import prefill_attention
    from nanovllm.layers.triton_moe import fused_moe, route
    from nanovllm.layers.triton_norm import add_rms_norm, qk_norm_rope
    contexts, block_size = [40, 33, 70, 35], 16
    for kv in ("auto", "int8", "fp8"):
        q, cache, meta = make_case([1] * 4, contexts, 4, 2, 128, block_size, torch.bfloat16, "cpu", kv_cache_dtype=kv)
        meta.block_tables[[0, 2, 3], :2] = meta.block_tables[0, :2].clone()     # rows 0, 2, 3 share 2 blocks
        shared = torch.tensor(shared_prefix(meta.block_tables.tolist(), contexts, block_size), dtype=torch.int32)
        decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, 1, shared=shared)   # cascade
        decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, 2)                   # splits
        q, cache, meta = make_case([5, 3], [9, 20], 4, 2, 128, block_size, torch.bfloat16, "cpu", kv_cache_dtype=kv)
        prefill_attention(q, cache, meta.block_tables, meta.context_lens, meta.cu_seqlens_q, meta.max_seqlen_q, 0.1)
        # head_dim 64 (Llama-3.2-1B) takes tiles of up to 256 keys (triton_decode.pick_settings)
        q, cache, meta = make_case([1] * 4, contexts, 4, 2, 64, 256, torch.bfloat16, "cpu", kv_cache_dtype=kv)
        for block_n, warps, stages in ((256, 4, 2), (128, 2, 2)):
            decode_attention(q, cache, meta.block_tables, meta.context_lens, 0.1, 1,
                             {"block_n": block_n, "num_warps": warps, "num_stages": stages})
    for head_dim, weights in ((128, True), (128, False), (64, False)):     # Qwen3; Llama/Qwen2/Mistral; Llama-3.2-1B
        q, k = torch.randn(3, 8, head_dim, dtype=torch.bfloat16), torch.randn(3, 2, head_dim, dtype=torch.bfloat16)
        weight = (torch.ones(head_dim, dtype=torch.bfloat16),) * 2 if weights else (None, None)
        qk_norm_rope(q, k, torch.arange(3), *weight, 1e-6, torch.randn(16, head_dim))
    x = torch.randn(3, 1024, dtype=torch.bfloat16)
    add_rms_norm(x, torch.randn_like(x), torch.ones(1024, dtype=torch.bfloat16), 1e-6)
    for dtype, tokens in ((torch.bfloat16, 2), (torch.bfloat16, 9), (torch.float32, 2)):  # per pair; sorted; IEEE
        w13, w2 = torch.randn(16, 128, 128, dtype=dtype), torch.randn(16, 128, 64, dtype=dtype)
        weights, ids = route(torch.randn(tokens, 16, dtype=dtype), 4, True)
        fused_moe(torch.randn(tokens, 128, dtype=dtype), w13, w2, weights, ids)
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
    with open(path) as f:
        launches = json.load(f)
    failed = 0
    for launch in launches:
        fn = getattr(importlib.import_module(launch["module"]), launch["name"])
        signature = {name: launch["types"].get(name, "constexpr") for name in fn.arg_names}
        try:
            triton.compile(ASTSource(fn=fn, signature=signature, constexprs=launch["constexprs"]),
                           target=GPUTarget("cuda", 90, 32), options=launch["options"])
        except Exception as e:  # noqa: BLE001 - each failure is reported with its launch
            failed += 1
            print(launch["name"], launch["constexprs"], launch["options"], str(e).strip().splitlines()[-1])
    print(f"{failed} failed" if failed else f"{len(launches)} compiled")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    compile_all(sys.argv[1])
