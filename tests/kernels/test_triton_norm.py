"""Fused norm kernels (residual add + RMSNorm, q/k RMSNorm + RoPE, RoPE alone) against their plain-PyTorch
references."""
import pytest
import torch

from nanovllm.layers.layernorm import add_rms_norm_ref
from nanovllm.layers.rotary_embedding import apply_rotary_ref, qk_norm_rope_ref

triton = pytest.importorskip("triton")
from nanovllm.layers.triton_norm import add_rms_norm, qk_norm_rope  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.bfloat16, torch.float16] if CUDA else [torch.float32, torch.float16]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}
TOKENS = [1, 7, 256] if CUDA else [1, 5]
HIDDEN = [1024, 4096, 5120] if CUDA else [64, 96]


def cos_sin_cache(head_dim: int, max_pos: int = 4096) -> torch.Tensor:
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_reference(dtype, num_tokens, hidden, with_residual):
    torch.manual_seed(hidden + num_tokens)
    x = torch.randn(num_tokens, hidden, dtype=dtype, device=DEVICE) * 3
    residual = torch.randn_like(x) if with_residual else None
    weight = (torch.rand(hidden, device=DEVICE) + 0.5).to(dtype)
    got = add_rms_norm(x, residual, weight, 1e-6)
    want = add_rms_norm_ref(x, residual, weight, 1e-6)
    if with_residual:
        assert torch.equal(got[1], want[1])                 # the new residual stream is the same sum
        got, want = got[0], want[0]
    torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("heads", [(16, 8), (32, 8), (6, 2)] if CUDA else [(4, 2), (6, 3)])
@pytest.mark.parametrize("head_dim", [64, 128] if CUDA else [16, 32])
@pytest.mark.parametrize("norm", [True, False])
def test_qk_norm_rope_matches_reference(dtype, num_tokens, heads, head_dim, norm):
    """With norm weights Qwen3's qk-norm then RoPE; without (Llama, Qwen2, Mistral) RoPE alone."""
    num_heads, num_kv_heads = heads
    torch.manual_seed(num_tokens * head_dim)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, device=DEVICE) * 2
    q, k, _ = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q, k = q.view(-1, num_heads, head_dim), k.view(-1, num_kv_heads, head_dim)   # strided views, as in the model
    positions = torch.randint(0, 4096, (num_tokens,), device=DEVICE)
    q_weight, k_weight = ((torch.rand(head_dim, device=DEVICE) + 0.5).to(dtype) for _ in range(2))
    cache = cos_sin_cache(head_dim)
    if norm:
        got = qk_norm_rope(q, k, positions, q_weight, k_weight, 1e-6, cache)
        want = qk_norm_rope_ref(q, k, positions, q_weight, k_weight, 1e-6, cache)
    else:
        got = qk_norm_rope(q, k, positions, None, None, 0.0, cache)
        cos, sin = cache[positions].unsqueeze(1).chunk(2, dim=-1)
        want = apply_rotary_ref(q, cos, sin), apply_rotary_ref(k, cos, sin)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.is_contiguous()
        torch.testing.assert_close(g, w, **TOL[dtype])
