"""AWQ W4A16: packing, loading, the engine against transformers, errors, and the quantizer (the kernels
against the reference: test_awq_kernels.py)."""
import json
import os

import pytest
import torch
from tiny_models import hf_greedy, hf_logits

from awq.awq_models import GROUP, dequantized_hf, make_awq_model
from nanovllm import LLM, SamplingParams
from nanovllm.quant.awq import (
    dequantize_awq,
    dequantize_packed,
    pack_awq,
    repack_awq,
    unpack_awq,
)
from nanovllm.quant.awq_method import AWQConfig
from nanovllm.quant.awq_quantize import fake_quantize, quantize_rtn, to_awq_tensors

KW = dict(kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256)


def autoawq_pack(intweight: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's own packing loop (written out independently): nibble i of column c holds
    column c * 8 + order_map[i]."""
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    packed = torch.zeros(intweight.shape[0], intweight.shape[1] // 8, dtype=torch.int64)
    for col in range(intweight.shape[1] // 8):
        for i in range(8):
            packed[:, col] |= intweight[:, col * 8 + order_map[i]].to(torch.int64) << (i * 4)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def test_pack_unpack_match_autoawq_order():
    values = torch.randint(0, 16, (12, 64), dtype=torch.int32)
    assert torch.equal(pack_awq(values), autoawq_pack(values))
    assert torch.equal(unpack_awq(autoawq_pack(values)), values)


def test_dequantize_matches_fake_quantization():
    w = torch.randn(48, 64)
    t = to_awq_tensors(w, GROUP)
    assert t["qweight"].shape == (64, 6) and t["qzeros"].shape == (2, 6) and t["scales"].shape == (2, 48)
    deq = dequantize_awq(t["qweight"], t["qzeros"], t["scales"], GROUP).t()
    torch.testing.assert_close(deq, fake_quantize(w, GROUP), atol=2e-3, rtol=2e-3)   # scales stored in fp16
    assert ((deq - w).norm() / w.norm()) < 0.1


def test_repacked_layout_dequantizes_to_the_checkpoint_weight():
    """Kernel layout (words along the input, eight slices per group) against AutoAWQ's, value by value."""
    values = torch.randint(0, 16, (256, 64), dtype=torch.int32)
    zeros = torch.randint(0, 16, (256 // 64, 64), dtype=torch.int32)
    scales = torch.rand(256 // 64, 64).half()
    qweight, z = repack_awq(autoawq_pack(values), autoawq_pack(zeros), 64)
    assert qweight.shape == (32, 64) and torch.equal(z, zeros.half())
    rows = 64 // 8              # word row g * 8 + r, nibble i holds input g * 64 + i * 8 + r
    for k in (0, 7, 8, 63, 64, 200, 255):
        g, i, r = k // 64, (k % 64) // rows, k % rows
        assert torch.equal((qweight[g * rows + r] >> (4 * i)) & 0xF, values[k])
    want = dequantize_awq(autoawq_pack(values), autoawq_pack(zeros), scales, 64)
    assert torch.equal(dequantize_packed(qweight, z, scales, 64), want)


@pytest.fixture(scope="module")
def awq_pair(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("awq"))
    hf = make_awq_model(path, num_heads=4, num_kv_heads=2, head_dim=32)
    return path, dequantized_hf(path, hf)


def test_engine_equals_hf_on_dequantized_weights(awq_pair):
    path, hf = awq_pair
    llm = LLM(path, dtype="float32", **KW)
    assert type(llm.model_runner.model.model.layers[0].mlp.down_proj.quant_method).__name__ == "AWQLinearMethod"
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], list(range(40, 80))]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    for p, out in zip(prompts, outs):
        assert out["token_ids"] == hf_greedy(hf, p, 16)
    from nanovllm.engine.scheduler import ScheduledBatch
    from nanovllm.engine.sequence import Sequence
    seq = Sequence(prompts[1])
    llm.scheduler.block_manager.allocate(seq)
    seq.num_computed_tokens = 0                          # compute every position, cached or not
    logits, _ = llm.model_runner.forward_logits(ScheduledBatch([seq], [len(seq)]))
    torch.testing.assert_close(logits[0].float().cpu(), hf_logits(hf, prompts[1]), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("arch, cfg", [("Qwen2ForCausalLM", {}),
                                       ("LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
                                       ("MistralForCausalLM", dict(sliding_window=None))])
def test_awq_of_other_architectures_equals_hf_on_dequantized_weights(tmp_path, arch, cfg):
    """AutoAWQ checkpoints of Qwen2, Llama (with every bias) and Mistral: the quantized linears keep their
    biases, and greedy ids equal transformers running the dequantized weights."""
    hf = dequantized_hf(str(tmp_path), make_awq_model(str(tmp_path), arch=arch, **cfg))
    llm = LLM(str(tmp_path), dtype="float32", **KW)
    layer = llm.model_runner.model.model.layers[0]
    assert type(layer.self_attn.qkv_proj.quant_method).__name__ == "AWQLinearMethod"
    if arch != "MistralForCausalLM":
        assert layer.self_attn.qkv_proj.bias is not None
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], list(range(40, 80))]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert [o["token_ids"] for o in outs] == [hf_greedy(hf, p, 12) for p in prompts]


@pytest.mark.cuda
def test_fused_activation_in_the_engine_on_gpu(tmp_path):
    """A one-token forward of a group-128 AWQ model in bf16 on the GPU runs down with silu(gate) * up computed
    inside its GEMV: the logits match the same engine with the activation kernel, and HF on the dequantized
    weights (float32) to bf16 accuracy."""
    from nanovllm.engine.scheduler import ScheduledBatch
    from nanovllm.engine.sequence import Sequence
    from nanovllm.quant.awq_method import AWQLinearMethod
    from nanovllm.quant.gluon_awq_gemv import gluon_supported
    if not gluon_supported(torch.zeros(1, 128, dtype=torch.bfloat16, device="cuda"), 128):
        pytest.skip("needs a Triton with Gluon")
    hf = make_awq_model(str(tmp_path), group=128, num_heads=4, num_kv_heads=2, head_dim=32, hidden=128)
    hf = dequantized_hf(str(tmp_path), hf, group=128)
    llm = LLM(str(tmp_path), device="cuda", dtype="bfloat16", enforce_eager=True, **KW)
    mlp = llm.model_runner.model.model.layers[0].mlp
    gate_up = mlp.gate_up_proj(torch.randn(1, 128, dtype=torch.bfloat16, device="cuda"))
    assert mlp.down_proj.forward_silu_and_mul(gate_up) is not None            # the fused path is the one run

    def last_logits(prompt):
        seq = Sequence(prompt)
        llm.scheduler.block_manager.allocate(seq)
        logits, _ = llm.model_runner.forward_logits(ScheduledBatch([seq], [len(seq)]))
        llm.scheduler.block_manager.deallocate(seq)
        return logits[0].float().cpu()

    fused = last_logits([7])
    unfused_method = AWQLinearMethod.apply_silu_and_mul
    AWQLinearMethod.apply_silu_and_mul = lambda self, layer, gate_up, bias: None
    try:
        unfused = last_logits([7])
    finally:
        AWQLinearMethod.apply_silu_and_mul = unfused_method
    ref = hf_logits(hf, [7])
    assert (fused - unfused).norm() / unfused.norm() < 1e-2
    assert (fused - ref).norm() / ref.norm() < 3e-2


def test_awq_in_half_precision_runs(awq_pair):
    path, _ = awq_pair
    for dtype in ("float16", "bfloat16"):
        out = LLM(path, dtype=dtype, **KW).generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4),
                                                    use_tqdm=False)[0]
        assert len(out["token_ids"]) == 4


def rewrite_config(path, **changes):
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    qc = config["quantization_config"]
    for key, value in changes.items():
        if value is None:
            qc.pop(key, None)
        else:
            qc[key] = value
    if changes.get("remove"):
        del config["quantization_config"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


@pytest.mark.parametrize("change,match", [
    (dict(bits=8), "bits=8"),
    (dict(zero_point=False), "zero_point"),
    (dict(version="gemv"), "gemv"),
    (dict(group_size=24), "group_size=24 must divide"),
    (dict(remove=True), "no quantization_config"),
])
def test_bad_awq_checkpoints_fail_clearly(tmp_path, change, match):
    make_awq_model(str(tmp_path))
    rewrite_config(str(tmp_path), **change)
    with pytest.raises(ValueError, match=match):
        LLM(str(tmp_path), **KW)


def test_old_quant_config_json_is_read(tmp_path):
    make_awq_model(str(tmp_path))
    rewrite_config(str(tmp_path), remove=True)
    with open(tmp_path / "quant_config.json", "w") as f:
        json.dump({"w_bit": 4, "q_group_size": GROUP, "zero_point": True, "version": "GEMM"}, f)
    out = LLM(str(tmp_path), **KW).generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0]["token_ids"]) == 3


def test_awq_config_validates():
    assert AWQConfig(group_size=128).method_for("qkv_proj") is not None
    assert AWQConfig(group_size=128, modules_to_not_convert=["down_proj"]).method_for("down_proj") is None


def test_rtn_zero_points_span_the_range():
    w = torch.tensor([[-1.0, 0.0, 0.5, 2.0] * 8])
    q, zeros, scales = quantize_rtn(w, GROUP)
    assert q.min() == 0 and q.max() == 15 and zeros.item() == 5
    assert scales.item() == pytest.approx(3.0 / 15)


def plant_outliers(hf, channels=(3, 17, 40, 51), factor=30.0):
    """Make a few input channels of q/k/v and gate/up carry large activations (the function is unchanged:
    the norm's weight grows, the weight columns shrink), as real LLMs have."""
    with torch.no_grad():
        for layer in hf.model.layers:
            for norm, linears in ((layer.input_layernorm, [layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                           layer.self_attn.v_proj]),
                                  (layer.post_attention_layernorm, [layer.mlp.gate_proj, layer.mlp.up_proj])):
                for c in channels:
                    norm.weight[c] *= factor
                    for lin in linears:
                        lin.weight[:, c] /= factor
                        lin.weight[:, c] *= 8      # and make those columns matter: salient weights
    return hf


def test_awq_beats_rtn_with_outlier_channels(tmp_path):
    import copy

    from tiny_models import make_tiny_model

    from nanovllm.quant.awq_quantize import quantize_model
    base = plant_outliers(make_tiny_model(str(tmp_path / "fp"), num_heads=4, num_kv_heads=2, head_dim=32))
    g = torch.Generator().manual_seed(0)
    calib = torch.randint(0, 256, (1, 256), generator=g)
    evaluation = torch.randint(0, 256, (1, 200), generator=g)
    with torch.no_grad():
        ref = base(evaluation).logits
    errors = {}
    for method in ("rtn", "awq"):
        model = copy.deepcopy(base)
        tensors = quantize_model(model, calib, GROUP, method)
        state = model.state_dict()
        for name in state:
            prefix = name[:-len(".weight")]
            if f"{prefix}.qweight" in tensors:
                state[name] = dequantize_awq(tensors[f"{prefix}.qweight"], tensors[f"{prefix}.qzeros"],
                                             tensors[f"{prefix}.scales"], GROUP).t()
            else:
                state[name] = tensors[name].float()
        model.load_state_dict(state)
        with torch.no_grad():
            errors[method] = ((model(evaluation).logits - ref).norm() / ref.norm()).item()
    assert errors["awq"] < 0.8 * errors["rtn"], errors


def test_quantizer_cli_writes_a_loadable_checkpoint(tmp_path):
    import subprocess
    import sys

    from tiny_models import make_tiny_model
    make_tiny_model(str(tmp_path / "fp"), num_heads=4, num_kv_heads=2, head_dim=32)
    subprocess.run([sys.executable, "-m", "nanovllm.quant.awq_quantize", "--model", str(tmp_path / "fp"), "--out",
                    str(tmp_path / "awq"), "--group-size", "32", "--calib-tokens", "128"], check=True,
                   capture_output=True, timeout=300)
    with open(tmp_path / "awq" / "config.json") as f:
        assert json.load(f)["quantization_config"]["version"] == "gemm"
    llm = LLM(str(tmp_path / "awq"), **KW)
    assert llm.config.dtype == torch.float16
    out = llm.generate(["Beautiful is"], SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0]
    assert len(out["token_ids"]) == 5


def test_quantizing_a_tied_model_keeps_it_tied(tmp_path):
    """A model whose head is its embedding gets no separate lm_head.weight (the loader would untie it)."""
    from safetensors import safe_open
    from tiny_models import make_tiny_model

    from nanovllm.quant.awq_quantize import quantize_checkpoint
    make_tiny_model(str(tmp_path / "fp"), num_heads=4, num_kv_heads=2, head_dim=32, tie=True)
    quantize_checkpoint(str(tmp_path / "fp"), str(tmp_path / "q"), "rtn", 32)
    with safe_open(str(tmp_path / "q" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_awq_under_tensor_parallelism(awq_pair):
    path, _ = awq_pair
    prompts = [[5, 6, 7, 8], list(range(100, 150))]
    params = SamplingParams(temperature=0, max_tokens=12)
    tp1 = LLM(path, dtype="float32", device="cpu", **KW).generate(prompts, params, use_tqdm=False)
    llm = LLM(path, dtype="float32", tensor_parallel_size=2, device="cpu", **KW)
    try:
        tp2 = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert [o["token_ids"] for o in tp2] == [o["token_ids"] for o in tp1]
