"""Regression cases behind regression_test.sh: `python -m nanovllm.tools.regression CASE`.

Each case prints one line, `[PASS] CASE: ...`, `[FAIL] CASE: reason` or `[SKIP] CASE: reason`, writes its
JSON under results/regression/ (untracked; NANOVLLM_REGRESSION_OUT moves it), and exits 0 (pass), 1 (fail)
or 2 (skip). Cases run on the GPU when CUDA is available (CUDA_VISIBLE_DEVICES is the caller's), else
their CPU versions on the demo model.
"""
import json
import os
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone

import torch

from nanovllm import LLM, SamplingParams
from nanovllm.demo import DEMO_MODEL_DIR
from nanovllm.utils.results import results_path

OUT_DIR = os.environ.get("NANOVLLM_REGRESSION_OUT", results_path("regression"))
CUDA = torch.cuda.is_available()
KW = dict(max_model_len=1024, gpu_memory_utilization=0.3)
ZEN_PROMPTS = ["Beautiful is better than", "Errors should never", "Special cases aren't"]


class Fail(Exception):
    pass


def check(condition: bool, reason: str) -> None:
    if not condition:
        raise Fail(reason)


def greedy(llm: LLM, prompts=ZEN_PROMPTS, max_tokens: int = 40) -> list[dict]:
    return llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)


def awq_demo_checkpoint() -> str:
    from nanovllm.quant.awq_quantize import quantize_checkpoint
    path = os.path.join(tempfile.gettempdir(), "nanovllm-regression-awq-demo")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        quantize_checkpoint(DEMO_MODEL_DIR, path, "awq", 128, None, 512)
    return path


def case_a() -> dict:
    """KV cache quantization: throughput on conversation prompts and the numeric check."""
    from benchmarks.verify_kv_quant import compare, demo_prompts  # the repository root is on sys.path (-m, script)
    ref = LLM(DEMO_MODEL_DIR, **KW)
    record = {}
    for kv in ("int8", "fp8"):
        quant = LLM(DEMO_MODEL_DIR, kv_cache_dtype=kv, **KW)
        quality = compare(ref, quant, demo_prompts(ref, 6), 60)
        start = time.perf_counter()
        outs = greedy(quant, ZEN_PROMPTS * 4, 100)
        record[kv] = {**quality, "tokens_per_s": sum(len(o["token_ids"]) for o in outs) / (time.perf_counter() - start)}
        check(quality["teacher_forced_top1_agreement"] >= 0.99,
              f"{kv}: teacher-forced top-1 agreement {quality['teacher_forced_top1_agreement']:.3f} < 0.99")
        quant.shutdown()
    return record


def case_b() -> dict:
    """AWQ model loads and generates sane output; memory and speed recorded."""
    llm = LLM(awq_demo_checkpoint(), **KW)
    start = time.perf_counter()
    outs = greedy(llm, ZEN_PROMPTS * 4, 100)
    seconds = time.perf_counter() - start
    text = outs[0]["text"]
    check(text.startswith(" ugly."), f"AWQ demo model says {text[:40]!r}, not ' ugly.'")
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.model_runner.model.parameters())
    return {"text": text[:80], "tokens_per_s": sum(len(o["token_ids"]) for o in outs) / seconds,
            "weight_bytes": weight_bytes}


def case_c() -> dict:
    """bf16 vs AWQ vs the AWQ checkpoint without its quantization config (the clear error is the pass)."""
    bf16 = greedy(LLM(DEMO_MODEL_DIR, **KW))
    awq_path = awq_demo_checkpoint()
    awq = greedy(LLM(awq_path, **KW))
    agree = sum(a["token_ids"] == b["token_ids"] for a, b in zip(bf16, awq)) / len(bf16)
    broken = tempfile.mkdtemp()
    for name in os.listdir(awq_path):
        os.symlink(os.path.join(awq_path, name), os.path.join(broken, name))
    os.remove(os.path.join(broken, "config.json"))
    with open(os.path.join(awq_path, "config.json")) as f:
        config = json.load(f)
    del config["quantization_config"]
    with open(os.path.join(broken, "config.json"), "w") as f:
        json.dump(config, f)
    try:
        LLM(broken, **KW)
    except ValueError as e:
        check("quantization_config" in str(e), f"unclear error: {e}")
        return {"bf16_awq_prompt_agreement": agree, "error": str(e)}
    raise Fail("the AWQ checkpoint without quantization_config loaded instead of failing")


def case_d() -> dict:
    """dtype: a bf16 checkpoint runs as bf16."""
    llm = LLM(DEMO_MODEL_DIR, **KW)
    check(llm.config.dtype == torch.bfloat16, f"dtype is {llm.config.dtype}")
    check(llm.model_runner.model.lm_head.weight.dtype == torch.bfloat16, "weights are not bf16")
    check(llm.model_runner.kv_caches[0].k.dtype == torch.bfloat16, "KV cache is not bf16")
    return {"dtype": "bfloat16"}


def case_e() -> dict:
    """TP=2 (two GPUs when there are two, else CPU with gloo) gives TP=1's tokens."""
    device = "cuda" if CUDA and torch.cuda.device_count() >= 2 else "cpu"
    one = greedy(LLM(DEMO_MODEL_DIR, device=device, **KW))
    llm = LLM(DEMO_MODEL_DIR, device=device, tensor_parallel_size=2, **KW)
    try:
        two = greedy(llm)
    finally:
        llm.shutdown()
    check([o["token_ids"] for o in one] == [o["token_ids"] for o in two], "TP=2 tokens differ from TP=1")
    return {"device": device}


def case_f() -> dict:
    """bf16 model with an int8 KV cache: attention output (the dequantized dtype) follows the model."""
    llm = LLM(DEMO_MODEL_DIR, kv_cache_dtype="int8", **KW)
    check(llm.model_runner.kv_caches[0].k.dtype == torch.int8, "cache is not int8")
    seen = []
    attn = llm.model_runner.attention_layers[0]
    handle = attn.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    outs = greedy(llm)
    handle.remove()
    check(seen and all(d == torch.bfloat16 for d in seen), f"attention output dtypes {set(seen)}")
    check(outs[0]["text"].startswith(" ugly."), f"int8 KV output {outs[0]['text'][:30]!r}")
    return {"attention_output_dtype": "bfloat16"}


def case_g() -> dict:
    """AWQ numerics: packing order, and one layer against the dequantize-then-matmul reference."""
    from nanovllm.quant.awq import awq_gemm_ref, kernel_layout, pack_awq, unpack_awq
    from nanovllm.quant.awq_quantize import to_awq_tensors
    values = torch.randint(0, 16, (8, 64), dtype=torch.int32)
    check(torch.equal(unpack_awq(pack_awq(values)), values), "pack/unpack round trip")
    check(pack_awq(torch.arange(8, dtype=torch.int32)[None]).item() == 0x75316420, "AutoAWQ nibble order")
    t = to_awq_tensors(torch.randn(512, 256), 128)
    device = "cuda" if CUDA else "cpu"
    x = torch.randn(7, 256, dtype=torch.float16 if CUDA else torch.float32, device=device)
    t = {k: v.to(device) for k, v in kernel_layout(t, 128).items()}
    ref = awq_gemm_ref(x.float(), t["qweight"], t["zeros"], t["scales"], 128)
    if CUDA:
        from nanovllm.quant.triton_awq import awq_gemm
        got = awq_gemm(x, t["qweight"], t["zeros"], t["scales"], 128).float()
        err = ((got - ref).norm() / ref.norm()).item()
        check(err < 1e-2, f"Triton AWQ GEMM relative error {err:.2e}")
        return {"kernel_relative_error": err}
    return {"kernel": "reference only on CPU (the kernel runs under TRITON_INTERPRET in the test suite)"}


def case_h() -> dict:
    """Checkpoint integrity: a missing shard gives the clear error."""
    path = tempfile.mkdtemp()
    for name in os.listdir(DEMO_MODEL_DIR):
        if not name.endswith(".safetensors"):
            os.symlink(os.path.join(DEMO_MODEL_DIR, name), os.path.join(path, name))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}, f)
    try:
        LLM(path, **KW)
    except FileNotFoundError as e:
        check("model-00001-of-00002.safetensors" in str(e), f"error does not name the shard: {e}")
        return {"error": str(e)}
    raise Fail("a checkpoint with a missing shard loaded")


CASES = {"A": case_a, "B": case_b, "C": case_c, "D": case_d, "E": case_e, "F": case_f, "G": case_g, "H": case_h}


def main():
    name = sys.argv[1].upper()
    title = CASES[name].__doc__.split(":")[0]
    start = time.perf_counter()
    try:
        record, status, reason = CASES[name](), "PASS", ""
    except Fail as e:
        record, status, reason = {}, "FAIL", str(e)
    except Exception as e:  # noqa: BLE001 - any crash is a failed case, reported with its cause
        record, status, reason = {"traceback": traceback.format_exc()}, "FAIL", f"{type(e).__name__}: {e}"
    record.update(case=name, status=status, reason=reason, seconds=round(time.perf_counter() - start, 1),
                  device=torch.cuda.get_device_name() if CUDA else "cpu",
                  date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, f"case_{name}.json"), "w") as f:
        json.dump(record, f, indent=2, default=str)
    print(f"[{status}] {name}. {title}{': ' + reason if reason else ''}")
    sys.exit(0 if status == "PASS" else 1)


if __name__ == "__main__":
    main()
