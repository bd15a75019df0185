"""A vLLM offline script's reading of outputs and prompts works unchanged (issue 43, part), and the
dict keys nanovllm returned before still answer."""
import json
import os

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.demo import DEMO_MODEL_DIR


@pytest.fixture(scope="module")
def llm():
    return LLM(DEMO_MODEL_DIR, max_model_len=256)


def test_request_outputs_read_as_vllm_and_as_dicts(llm):
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=1)
    outputs = llm.generate(["Beautiful is better than", "Errors should never"], params, use_tqdm=False)
    for output in outputs:          # the loop of vLLM's offline example
        prompt, generated = output.prompt, output.outputs[0].text
        assert isinstance(prompt, str) and generated == output["text"]
        assert output.outputs[0].token_ids == output["token_ids"] and output.prompt_token_ids
        assert output.outputs[0].finish_reason == output["finish_reason"] == "length" and output.finished
        assert output.outputs[0].cumulative_logprob == pytest.approx(output["cumulative_logprob"])
        assert json.loads(json.dumps(output))["text"] == generated      # still a plain dict underneath
    assert outputs[0].prompt == "Beautiful is better than"


def test_prompts_as_vllm_takes_them(llm):
    params = SamplingParams(temperature=0, max_tokens=6)
    ids = llm.get_tokenizer().encode("Errors should never")
    want = llm.generate(["Errors should never"], params, use_tqdm=False)[0]["token_ids"]
    for prompt in ({"prompt": "Errors should never"}, {"prompt_token_ids": ids}, [{"prompt_token_ids": ids}]):
        out = llm.generate(prompt, params, use_tqdm=False)
        assert out[0].outputs[0].token_ids == want
    assert llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].prompt is None
    bad = llm.generate([{"text": "x"}, "Errors should never"], params, use_tqdm=False)
    assert "prompt_token_ids" in bad[0]["error"] and bad[1].outputs[0].token_ids == want


def test_chat_template_kwargs_reach_the_template(llm, monkeypatch):
    seen = {}
    template = llm.tokenizer.apply_chat_template

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return template(*args, **{k: v for k, v in kwargs.items() if k != "enable_thinking"})

    monkeypatch.setattr(llm.tokenizer, "apply_chat_template", spy)
    llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2), use_tqdm=False,
             chat_template_kwargs={"enable_thinking": False})
    assert seen["enable_thinking"] is False


def test_a_hub_id_says_where_to_put_the_files():
    with pytest.raises(ValueError, match="huggingface-cli download Qwen/Qwen3-0.6B"):
        LLM("Qwen/Qwen3-0.6B")


def test_the_automatic_backend_fits_the_kv_cache_dtype(monkeypatch):
    """With flash-attn installed, 'auto' picks it only for a 16-bit cache (it has no INT8/FP8 cache)."""
    import importlib.util

    from nanovllm.attention import backend
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "flash_attn" else real(name))
    assert backend.resolve_backend_name("auto", "cuda", "auto") == "flash_attn"
    assert backend.resolve_backend_name("auto", "cuda", "int8") == "triton"
    assert backend.resolve_backend_name("auto", "cpu", "fp8") == "torch"


def test_bench_refuses_lengths_its_workload_cannot_draw():
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "bench.py", "--max-input-len", "50"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and "--max-input-len" in run.stderr and "Traceback" not in run.stderr


def test_regression_script_answers_help_and_refuses_unknown_cases():
    import subprocess
    ok = subprocess.run(["bash", "regression_test.sh", "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "Usage: bash regression_test.sh" in ok.stdout and "crashed" not in ok.stdout
    bad = subprocess.run(["bash", "regression_test.sh", "Z"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown case 'Z'" in bad.stderr


VLLM_SCRIPT = '''
import sys

from nanovllm import LLM, SamplingParams   # the one line that differs from the vLLM script

prompts = ["Beautiful is better than", "Errors should never", "Now is better than"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=12, n=2, stop=["."])


def main():
    llm = LLM(model=sys.argv[1], max_model_len=256)
    outputs = llm.generate(prompts, sampling_params)
    print("Generated Outputs:")
    for output in outputs:
        prompt = output.prompt
        for completion in output.outputs:
            print(f"Prompt: {prompt!r}, Output: {completion.text!r}, {completion.finish_reason}")
    conversation = [{"role": "system", "content": "You are a helpful assistant"},
                    {"role": "user", "content": "Hello"}]
    outputs = llm.chat(conversation, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False,
                       chat_template_kwargs={"enable_thinking": False})
    print(f"Chat: {outputs[0].outputs[0].text!r}")


if __name__ == "__main__":
    main()
'''


def test_a_vllm_offline_script_runs_on_the_demo_model(tmp_path):
    """vLLM's offline example (generate with temperature, top_p, max_tokens, n, stop; a loop over
    output.outputs; chat with chat_template_kwargs), its import line changed and nothing else."""
    import os
    import subprocess
    import sys
    script = tmp_path / "vllm_example.py"
    script.write_text(VLLM_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    run = subprocess.run([sys.executable, str(script), DEMO_MODEL_DIR], capture_output=True, text=True, timeout=300,
                         env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("Prompt: ")]
    assert len(lines) == 6 and all(line.endswith(("stop", "length")) for line in lines)
    assert any(line.startswith("Chat: ") for line in run.stdout.splitlines())


def test_vllm_engine_arguments_quantization_tokenizer_and_trust_remote_code(llm, tmp_path, monkeypatch):
    """quantization= names the checkpoint's method (checked, never a quantization at load); tokenizer= reads
    the tokenizer from another directory; trust_remote_code= reaches transformers' loaders."""
    import shutil

    import transformers

    from nanovllm.config import Config
    awq = tmp_path / "awq"
    awq.mkdir()
    with open(os.path.join(DEMO_MODEL_DIR, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}
    (awq / "config.json").write_text(json.dumps(config))
    for name in ("awq", "awq_marlin", None):
        assert Config(str(awq), max_model_len=256, quantization=name).quantization == name
    with pytest.raises(ValueError, match="not an AWQ checkpoint.*awq_quantize"):
        Config(DEMO_MODEL_DIR, max_model_len=256, quantization="awq")
    with pytest.raises(ValueError, match=r"quantization='gptq' is not supported; choose one of \[None, 'awq'"):
        Config(DEMO_MODEL_DIR, max_model_len=256, quantization="gptq")
    with pytest.raises(ValueError, match="tokenizer=.* is not a directory"):
        Config(DEMO_MODEL_DIR, max_model_len=256, tokenizer=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="trust_remote_code must be True or False"):
        Config(DEMO_MODEL_DIR, max_model_len=256, trust_remote_code="yes")

    bare = tmp_path / "bare"                    # config.json alone: no tokenizer of its own, random weights
    bare.mkdir()
    shutil.copy(os.path.join(DEMO_MODEL_DIR, "config.json"), bare)
    seen = {}                                   # loader -> the trust_remote_code of each call
    for cls in (transformers.AutoConfig, transformers.AutoTokenizer):
        real = cls.from_pretrained
        monkeypatch.setattr(cls, "from_pretrained", lambda *a, real=real, name=cls.__name__, **k: seen.setdefault(
            name, []).append(k.get("trust_remote_code")) or real(*a, **k))
    other = LLM(str(bare), load_format="dummy", tokenizer=DEMO_MODEL_DIR, trust_remote_code=True, max_model_len=64)
    assert seen["AutoTokenizer"] == [True] and seen["AutoConfig"] and all(seen["AutoConfig"])
    assert other.get_tokenizer().encode("Beautiful") == llm.get_tokenizer().encode("Beautiful")   # the demo's
    out = other.generate(["Beautiful is"], SamplingParams(max_tokens=3), use_tqdm=False)[0]
    assert isinstance(out.outputs[0].text, str) and len(out.outputs[0].token_ids) == 3
