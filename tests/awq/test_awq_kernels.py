"""AWQ kernels against the reference (`awq_gemm_ref`: dequantize, then matmul): every method on CPU under the
Triton interpreter at tiny sizes, and on the GPU at real sizes, split-K, the Hopper wgmma kernel, and the
one-token GEMV that takes SwiGLU's activation."""
import functools

import pytest
import torch

from awq.awq_models import GROUP
from nanovllm.quant.awq import awq_gemm_ref, dequantize_packed, kernel_layout
from nanovllm.quant.awq_quantize import to_awq_tensors


def layer_on(device: str, k: int, n: int, group: int) -> dict:
    return {name: v.to(device) for name, v in kernel_layout(to_awq_tensors(torch.randn(n, k), group), group).items()}


@pytest.mark.parametrize("m", [1, 3, 8, 40])
@pytest.mark.parametrize("group,k", [(8, 64), (24, 96), (GROUP, 128), (128, 256)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_triton_kernels_match_reference(m, group, k, dtype):
    """Every method a shape supports (gemv up to 8 tokens, the tensor-core kernel from group 128 on; group 24,
    whose 3 word rows are no Triton block, only dequantize + cuBLAS)."""
    pytest.importorskip("triton")
    from nanovllm.quant.triton_awq import awq_dequantize, awq_gemm, supported_methods
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = layer_on(device, k, 96, group)
    got = awq_dequantize(t["qweight"], t["zeros"], t["scales"], group, dtype)
    want = dequantize_packed(t["qweight"], t["zeros"], t["scales"], group)
    assert got.dtype == dtype and torch.equal(got, want.to(dtype))
    x = torch.randn(m, k, dtype=dtype, device=device)
    ref = awq_gemm_ref(x.float(), t["qweight"], t["zeros"], t["scales"], group)
    methods = supported_methods(m, group, x)
    assert ("gemv" in methods) == (m <= 8 and group != 24) and ("fused" in methods) == (group >= 128)
    hopper = group == 128 and dtype == torch.float16 and device == "cuda" and torch.cuda.get_device_capability()[0] == 9
    assert ("mma" in methods) == ("mma256" in methods) == hopper
    for method in methods:
        out = awq_gemm(x, t["qweight"], t["zeros"], t["scales"], group, method=method)
        assert out.dtype == dtype
        assert ((out.float() - ref).norm() / ref.norm()) < (1e-2 if dtype == torch.float16 else 1e-5), method


@pytest.mark.parametrize("split_k", [1, 2, 3, 16])
@pytest.mark.parametrize("method,m", [("gemv", 2), ("fused", 20)])
def test_split_k_partials_add_up_and_reset_the_counters(split_k, method, m):
    """The last of the split_k programs adds the partials (16 splits of 4 groups: some empty); the counters
    are zero again for the next call."""
    pytest.importorskip("triton")
    from nanovllm.quant.triton_awq import awq_gemm, tile_counters
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = layer_on(device, 512, 128, 128)
    x = torch.randn(m, 512, device=device)
    ref = awq_gemm_ref(x, t["qweight"], t["zeros"], t["scales"], 128)
    settings = {"block_n": 32} if method == "gemv" else {}
    for _ in range(2):
        out = awq_gemm(x, t["qweight"], t["zeros"], t["scales"], 128, method=method, split_k=split_k, **settings)
        assert ((out - ref).norm() / ref.norm()) < 1e-5
    assert not tile_counters(x.device).any()


@pytest.mark.cuda
@pytest.mark.parametrize("split_k", [1, 3, 16])
@pytest.mark.parametrize("m", [1, 17, 100])
@pytest.mark.parametrize("block_n,warps", [(128, 8), (256, 16)])
def test_mma_kernel_split_k_and_ragged_tiles(split_k, m, block_n, warps):
    """The Hopper wgmma kernel, 128 and 256 columns per program ("mma", "mma256"): token tiles with rows past
    M, output columns past N (160 = 1.25 tiles of 128, 0.6 of 256), K split into uneven and empty ranges (16
    splits of 4 groups); the counters reset."""
    from nanovllm.quant.gluon_awq_mma import gluon_awq_mma, mma_supported
    from nanovllm.quant.triton_awq import tile_counters
    x = torch.randn(m, 512, dtype=torch.bfloat16, device="cuda")
    if not mma_supported(x, 128):
        pytest.skip("needs a Hopper GPU and a Triton with Gluon")
    t = layer_on("cuda", 512, 160, 128)
    ref = awq_gemm_ref(x.float(), t["qweight"], t["zeros"], t["scales"], 128)
    for _ in range(2):
        out = gluon_awq_mma(x, t["qweight"], t["zeros"], t["scales"], split_k=split_k, block_n=block_n, warps=warps)
        assert ((out.float() - ref).norm() / ref.norm()) < 1e-2
    assert not tile_counters(x.device).any()


@pytest.mark.cuda
@pytest.mark.parametrize("k,n", [(12288, 4096), (3072, 1024), (512, 160)])     # 8B down, 0.6B down, ragged
def test_gated_gemv_matches_silu_and_mul(k, n):
    """The one-token GEMV that computes silu(gate) * up of its input itself, at the default split and at
    splits that leave one group or all of them to a program; the counters reset."""
    from nanovllm.layers.activation import silu_and_mul
    from nanovllm.quant.gluon_awq_gemv import (
        MAX_GATED_GROUPS,
        gluon_awq_gemv,
        gluon_supported,
        groups_per_program,
    )
    from nanovllm.quant.triton_awq import tile_counters
    gate_up = torch.randn(1, 2 * k, dtype=torch.bfloat16, device="cuda")
    if not gluon_supported(gate_up, 128):
        pytest.skip("needs a Triton with Gluon")
    t = layer_on("cuda", k, n, 128)
    ref = awq_gemm_ref(silu_and_mul(gate_up).float(), t["qweight"], t["zeros"], t["scales"], 128)
    for split_k in (None, k // 128, 1):
        if split_k and groups_per_program(k, split_k) > MAX_GATED_GROUPS:
            continue
        out = gluon_awq_gemv(gate_up, t["qweight"], t["zeros"], t["scales"], split_k=split_k, gated=True)
        assert ((out.float() - ref).norm() / ref.norm()) < 1e-2, split_k
    assert not tile_counters(gate_up.device).any()


def test_fused_activation_only_where_the_gluon_gemv_runs():
    """On the CPU (and for more than one token) the MLP applies silu_and_mul itself."""
    from nanovllm.quant.awq_method import AWQConfig, AWQLinearMethod
    method = AWQLinearMethod(AWQConfig(group_size=128))
    layer = torch.nn.Module()
    method.create_weights(layer, 256, 64)
    assert method.apply_silu_and_mul(layer, torch.zeros(1, 512, dtype=torch.bfloat16), None) is None


@functools.cache
def real_size_weight(k, n):
    g = torch.Generator(device="cuda").manual_seed(k + n)
    return kernel_layout(to_awq_tensors(torch.randn(n, k, generator=g, device="cuda") * 0.02, 128), 128)


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 2, 5, 8, 40, 64, 130, 256, 2048])
@pytest.mark.parametrize("k,n", [(1024, 6144), (4096, 24576), (12288, 4096)])   # 0.6B qkv, 8B gate_up, 8B down
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_awq_gemm_at_real_sizes(m, k, n, dtype):
    from nanovllm.quant.triton_awq import awq_gemm, supported_methods
    t = real_size_weight(k, n)
    x = torch.randn(m, k, dtype=dtype, device="cuda")
    ref = awq_gemm_ref(x.float(), t["qweight"], t["zeros"], t["scales"], 128)
    for method in supported_methods(m, 128, x):
        for _ in range(3):      # split-K counters must come back to zero between calls
            out = awq_gemm(x, t["qweight"], t["zeros"], t["scales"], 128, method=method)
            assert out.dtype == dtype and ((out.float() - ref).norm() / ref.norm()) < 1e-2, method
