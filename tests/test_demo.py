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
