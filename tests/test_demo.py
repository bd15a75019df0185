"""The committed demo model recites the Zen of Python, and example.py runs it."""
import subprocess
import sys

from nanovllm import LLM, SamplingParams
from nanovllm.demo import DEMO_MODEL_DIR
from nanovllm.demo.train import zen_of_python


def test_demo_model_recites_the_zen_of_python():
    zen = zen_of_python()
    llm = LLM(DEMO_MODEL_DIR, max_model_len=1024)
    assert llm.config.dtype.is_floating_point and str(llm.config.dtype) == "torch.bfloat16"
    lines = [line for line in zen.splitlines() if len(line) > 30][:8]
    prompts = [line[:20] for line in lines]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        continuation = zen[zen.index(prompt) + len(prompt):][:40]
        assert out["text"] == continuation


def test_example_script_runs():
    out = subprocess.run([sys.executable, "example.py", "--max-tokens", "60"], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    assert "Completion:  ugly.\nExplicit is better than implicit." in out


def test_example_script_knows_the_demo_by_its_config_and_refuses_a_bad_path(tmp_path):
    import shutil
    copy = tmp_path / "my-demo"
    shutil.copytree(DEMO_MODEL_DIR, copy)
    out = subprocess.run([sys.executable, "example.py", str(copy), "--max-tokens", "20"], capture_output=True,
                         text=True, check=True, timeout=300).stdout
    assert "Completion:  ugly.\nExplicit" in out
    bad = subprocess.run([sys.executable, "example.py", "nanovllm"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "config.json" in bad.stderr


def test_the_code_model_trainer_writes_a_model_the_engine_runs(tmp_path):
    """issue 42's trainer at its tiny size: a few steps on the standard library's sources, then the engine
    loads the result and equals transformers on it."""
    import json
    import subprocess
    import sys

    from tiny_models import hf_greedy
    from transformers import AutoModelForCausalLM

    from nanovllm import LLM, SamplingParams
    out = tmp_path / "code"
    subprocess.run([sys.executable, "-m", "nanovllm.demo.train_code", "--size", "tiny", "--steps", "30", "--batch", "4",
                    "--window", "64", "--limit-bytes", "300000", "--log-every", "10", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    record = json.loads((out / "training.json").read_text())
    assert record["steps"] == 30 and record["held_out_bytes"] > 0 and len(record["curve"]) == 3
    assert record["curve"][-1]["loss"] < record["curve"][0]["loss"]             # it learns something
    llm = LLM(str(out), max_model_len=256, dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype="float32").eval()
    prompt = llm.get_tokenizer().encode("def main(")
    got = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]["token_ids"]
    assert got == hf_greedy(hf, prompt, 12)


def test_code_trainer_reads_empty_source_files():
    from nanovllm.demo.train_code import EOS, as_ids
    assert as_ids([b"ab", b"", b"c"]).tolist() == [97, 98, EOS, EOS, 99, EOS]
