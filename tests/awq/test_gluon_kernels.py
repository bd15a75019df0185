"""The Gluon kernels: the GEMV (one token, group 128; nanovllm/quant/gluon_awq_gemv.py), plain and with
SwiGLU's activation on its input, and the Hopper wgmma GEMM (quant/gluon_awq_mma.py). Gluon has no CPU
interpreter, so on CPU they are only compiled for Hopper (the API of the installed Triton, the layouts, the
register count); the GPU tests (test_awq_kernels.py: test_awq_gemm_at_real_sizes, test_triton_kernels_match_reference,
test_mma_kernel_split_k_and_ragged_tiles, test_gated_gemv_matches_silu_and_mul) check their outputs against
the references."""
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


def test_pdl_only_on_hopper_gpus(monkeypatch):
    """Programmatic dependent launch (utils/pdl.py): never on CPU or in the interpreter, off with NANOVLLM_PDL=0."""
    from nanovllm.utils.pdl import pdl_launch
    assert pdl_launch(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}
    if torch.cuda.is_available():
        hopper = torch.cuda.get_device_capability()[0] >= 9
        assert pdl_launch(torch.device("cuda", 0))["launch_pdl"] == (hopper and not os.environ.get("TRITON_INTERPRET"))
        monkeypatch.setenv("NANOVLLM_PDL", "0")
        pdl_launch.cache_clear()                    # read once per process and device
        assert pdl_launch(torch.device("cuda", 0)) == {"PDL": False, "launch_pdl": False}
        pdl_launch.cache_clear()


def compile_for_hopper() -> dict:
    """{kernel: registers and stack bytes per thread} of the kernels compiled for sm_90 (no GPU needed)."""
    from nanovllm.quant import gluon_awq_gemv as g
    from nanovllm.quant import gluon_awq_mma as mma
    pointers = ["x_ptr", "qweight_ptr", "zeros_ptr", "scales_ptr", "out_ptr", "partial_ptr", "count_ptr"]
    types = ["*bf16", "*i32", "*bf16", "*bf16", "*bf16", "*fp32", "*i32"]
    gemv = {"R": g.R, "C": g.C, "TR": g.TR, "WARPS": g.WARPS}
    return {"gemv": resources(g._gluon_awq_gemv_kernel, pointers, types,
                              {**gemv, "GATED": False, "MAX_GROUPS": 1, "PDL": True}, g.WARPS),
            "gemv_gated": resources(g._gluon_awq_gemv_kernel, pointers, types,
                                    {**gemv, "GATED": True, "MAX_GROUPS": 8, "PDL": True}, g.WARPS),
            **{f"mma{block_n}_{block_m}": resources(mma._gluon_awq_mma_kernel, pointers, types,
                                                    {"BLOCK_N": block_n, "BLOCK_M": block_m, "WARPS": warps,
                                                     "BF16": True, "PDL": True}, warps, mma.register_cap(warps))
               for block_n, warps in mma.TILES.values()
               for block_m in (16, 64)}}


def resources(fn, pointers: list[str], types: list[str], constexprs: dict, warps: int, options=None) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    signature = {name: types[pointers.index(name)] if name in pointers else
                 ("constexpr" if name in constexprs else "i32") for name in fn.arg_names}
    aligned = ("N", "K", "stride_xm", "stride_om")         # as the launches specialize them (multiples of 16)
    divisible = [i for i, name in enumerate(fn.arg_names) if name in pointers or name in aligned]
    src = GluonASTSource(fn=fn, signature=signature, constexprs=constexprs,
                         attrs={(i,): [["tt.divisibility", 16]] for i in divisible})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, **(options or {})})
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gluon_{os.getpid()}.cubin")
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    os.remove(path)
    return {"registers": int(usage.split("REG:")[1].split()[0]), "stack": int(usage.split("STACK:")[1].split()[0]),
            "griddepcontrol": sorted({line.split()[0].rstrip(";") for line in kernel.asm["ptx"].splitlines()
                                      if line.strip().startswith("griddepcontrol")})}


def test_gluon_kernels_compile_for_hopper():
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
    assert all(kernel["stack"] == 0 for kernel in usage.values()), usage                  # no spills
    assert usage["gemv"]["registers"] <= 168 and usage["gemv_gated"]["registers"] <= 168  # 3+ programs per SM
    # programmatic dependent launch (utils/pdl.py): the GEMVs wait for the kernel before and release the next
    wait_and_release = ["griddepcontrol.launch_dependents", "griddepcontrol.wait"]
    assert all(kernel["griddepcontrol"] == wait_and_release for kernel in usage.values()), usage


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print(json.dumps(compile_for_hopper()))
