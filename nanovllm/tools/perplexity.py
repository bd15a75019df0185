"""Perplexity of a text under the engine: `python -m nanovllm.tools.perplexity --model DIR --text FILE`.

The text is cut into windows of --max-len tokens that overlap by half (the sliding-window method of the
transformers docs): every token after the first is scored once, by the first window that holds it after
that window's start, so most tokens see at least max_len / 2 tokens of context. Each window is a prompt
with prompt_logprobs=0; all windows run as one batch.
    perplexity = exp(sum of -log p(token | context) / number of scored tokens)
Used to compare bf16, quantized KV caches and quantized weights on the same text.
"""
import argparse
import math
import os
import sys
from datetime import datetime, timezone

from nanovllm import LLM, SamplingParams
from nanovllm.utils.results import results_path, save_record


def windows(num_tokens: int, max_len: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored position in the window) for each window."""
    stride = max(1, max_len // 2)
    result, scored_until = [], 1
    for begin in range(0, num_tokens, stride):
        end = min(begin + max_len, num_tokens)
        result.append((begin, end, max(1, scored_until - begin)))
        scored_until = end
        if end == num_tokens:
            break
    return result


def perplexity(llm: LLM, token_ids: list[int], max_len: int) -> dict:
    if len(token_ids) < 2:
        raise ValueError("the text must have at least 2 tokens")
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2 (a window scores its tokens after the first), got {max_len}")
    if max_len >= llm.config.max_model_len:
        raise ValueError(f"max_len={max_len} windows do not fit max_model_len={llm.config.max_model_len}; "
                         f"use at most {llm.config.max_model_len - 1}")
    spans = windows(len(token_ids), max_len)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([token_ids[b:e] for b, e, _ in spans], params, use_tqdm=False)
    errors = [out["error"] for out in outs if out.get("error")]
    if errors:
        raise ValueError(f"a window was rejected: {errors[0]}")
    nll, count = 0.0, 0
    for (begin, end, first), out in zip(spans, outs):
        for i in range(first, end - begin):
            nll -= out["prompt_logprobs"][i][token_ids[begin + i]]
            count += 1
    return {"perplexity": math.exp(nll / count), "mean_nll": nll / count, "num_scored_tokens": count,
            "num_windows": len(spans), "max_len": max_len}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", required=True, help="a UTF-8 text file")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--out", default=None, help="JSON file (default: results/perplexity/..., untracked)")
    args = parser.parse_args()
    if args.max_len < 2:
        parser.error(f"--max-len must be >= 2, got {args.max_len}")
    if not os.path.isfile(args.text):
        parser.error(f"--text {args.text!r} is not a file")
    try:
        run(args)
    except ValueError as e:     # a bad model directory or setting: a usage error, not a traceback
        parser.error(str(e))


def run(args) -> None:
    llm = LLM(args.model, kv_cache_dtype=args.kv_cache_dtype, max_model_len=args.max_len + 1, device=args.device,
              load_format=args.load_format)
    if args.max_len >= llm.config.max_model_len:     # the model's positions end before --max-len
        print(f"# --max-len {args.max_len} is over the model's {llm.config.max_model_len - 1}-token windows: "
              f"using {llm.config.max_model_len - 1}", file=sys.stderr)
        args.max_len = llm.config.max_model_len - 1
    if llm.tokenizer is None:
        raise ValueError(f"{args.model} has no tokenizer, so a text cannot be scored")
    with open(args.text, encoding="utf-8") as f:
        token_ids = llm.tokenizer.encode(f.read())
    record = {**perplexity(llm, token_ids, args.max_len), "model": os.path.basename(os.path.normpath(args.model)),
              "text": os.path.basename(args.text), "kv_cache_dtype": args.kv_cache_dtype,
              "device": llm.config.device, "dtype": str(llm.config.dtype).replace("torch.", ""),
              "command": "python -m nanovllm.tools.perplexity " + " ".join(sys.argv[1:]),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    save_record(record, args.out or results_path("perplexity",
                                                 f"{record['model']}-{record['text']}-{args.kv_cache_dtype}.json"))


if __name__ == "__main__":
    main()
