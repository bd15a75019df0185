"""Generate with nanovllm: `python example.py [MODEL_DIR]` (default: the committed demo model)."""
import argparse
import json
import os

from nanovllm import LLM, SamplingParams
from nanovllm.demo import DEMO_MODEL_DIR


def is_demo(model_dir: str) -> bool:
    """The demo model, whatever its path (a copy, an AWQ quantization of it): its config.json says so."""
    try:
        with open(os.path.join(os.path.expanduser(model_dir), "config.json")) as f:
            return json.load(f).get("nanovllm_demo") is not None
    except (OSError, ValueError):
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", default=DEMO_MODEL_DIR, help="a Qwen3 checkpoint directory")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    args = parser.parse_args()
    demo = is_demo(args.model)
    try:
        llm = LLM(args.model, enforce_eager=args.enforce_eager, max_model_len=1024)
    except (ValueError, OSError) as e:
        parser.error(f"{args.model}: {e}")
    if demo:
        # The demo model memorized the Zen of Python: greedy decoding recites it from any line.
        prompts = ["Beautiful is better than", "Errors should never", "If the implementation is hard to explain,"]
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens or 120)
    else:
        prompts = ["introduce yourself", "list all prime numbers within 100"]
        prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                     add_generation_prompt=True) for p in prompts]
        params = SamplingParams(temperature=0.6, max_tokens=args.max_tokens or 256)
    for prompt, out in zip(prompts, llm.generate(prompts, params)):
        print(f"\nPrompt: {prompt}\nCompletion: {out.outputs[0].text}")


if __name__ == "__main__":
    main()
