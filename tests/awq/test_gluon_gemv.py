"""The Gluon GEMV (one token, group 128; nanovllm/quant/gluon_awq_gemv.py). Gluon has no CPU interpreter, so
on CPU it is only compiled for Hopper (the API of the installed Triton, the layouts, the register count); the
GPU tests (test_awq.py: test_awq_gemm_at_real_sizes and test_triton_kernels_match_reference at one token)
check its output against the reference."""
import json
import os
import subprocess
import sys

import pytest
import torch


def test_gluon_runs_only_where_it_can():
    pytest.importorskip("triton")
    from nanovllm.quant.gluon_awq_gemv import gluon_supported
    assert not gluon_supported(torch.zeros(1, 256, dtype=torch.bfloat16), 128)   # CPU: the Triton GEMV
    if torch.cuda.is_available():
        x = torch.zeros(2, 256, dtype=torch.bfloat16, device="cuda")
        assert not gluon_supported(x, 128) and not gluon_supported(x[:1], 64)
        assert not gluon_supported(x[:1].float(), 128)              # float32 needs the 128 + q floats


def compile_for_hopper() -> dict:
    """Registers and stack bytes per thread of the kernel compiled for sm_90 (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from nanovllm.quant import gluon_awq_gemv as g
    names = ["x_ptr", "qweight_ptr", "zeros_ptr", "scales_ptr", "out_ptr", "partial_ptr", "count_ptr", "N", "K",
             "split_k", "magic_16", "magic_12", "magic_8"]
    types = ["*bf16", "*i32", "*bf16", "*bf16", "*bf16", "*fp32", "*i32"] + ["i32"] * 6
    constexprs = {"R": g.R, "C": g.C, "TR": g.TR, "WARPS": g.WARPS}
    signature = {**dict(zip(names, types)), **{name: "constexpr" for name in constexprs}}
    src = GluonASTSource(fn=g._gluon_awq_gemv_kernel, signature=signature, constexprs=constexprs,
                         attrs={(i,): [["tt.divisibility", 16]] for i in range(9)})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": g.WARPS})
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gluon_gemv_{os.getpid()}.cubin")
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    os.remove(path)
    return {"registers": int(usage.split("REG:")[1].split()[0]), "stack": int(usage.split("STACK:")[1].split()[0])}


def test_gluon_gemv_compiles_for_hopper():
    """In a fresh process: the suite runs Triton in interpreter mode, which cannot compile."""
    pytest.importorskip("triton")
    from nanovllm.quant import gluon_awq_gemv
    if gluon_awq_gemv.gluon is None:
        pytest.skip("this Triton has no Gluon")
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, cwd=root,
                         capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    usage = json.loads(out.stdout.strip().splitlines()[-1])
    assert usage["stack"] == 0 and usage["registers"] <= 168      # no spills; 3+ programs of 4 warps per SM


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print(json.dumps(compile_for_hopper()))
