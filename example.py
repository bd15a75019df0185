"""Generate with nanovllm: `python example.py [MODEL_DIR]` (default: the committed demo model)."""
import argparse

from nanovllm import LLM, SamplingParams
from nanovllm.demo import DEMO_MODEL_DIR


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", default=DEMO_MODEL_DIR, help="a Qwen3 checkpoint directory")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    args = parser.parse_args()
    demo = args.model == DEMO_MODEL_DIR
    llm = LLM(args.model, enforce_eager=args.enforce_eager, max_model_len=1024)
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
        print(f"\nPrompt: {prompt!r}\nCompletion: {out['text']!r}")


if __name__ == "__main__":
    main()
