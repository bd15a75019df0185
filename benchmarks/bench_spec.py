"""N-gram speculative decoding on code-edit prompts, against plain decoding, per batch size (issue 42):

    python benchmarks/bench_spec.py [--model DIR] [--batches 1 8 64 256] [--max-tokens 256] [--out FILE]

A prompt is a held-out standard-library file (about 1,500 bytes from a line start), a marker, and the
file's first two lines again: a model that learned to copy continues with the file, as an edit of a file
repeats most of it. --model is a byte-level model trained by `python -m nanovllm.demo.train_code`
(default results/code-qwen3). Greedy, ignore_eos, max_tokens each. For each batch size: output tok/s of
both engines, their ratio, and the mean tokens per verification (1 + accepted drafts).
"""
import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository root
from nanovllm import LLM, SamplingParams  # noqa: E402
from nanovllm.demo.train_code import stdlib_sources  # noqa: E402
from nanovllm.utils.results import results_path, save_record  # noqa: E402

MARKER = b"\n\n# ---- the same code, edited ----\n"


def code_edit_prompts(count: int, size: int = 1500) -> list[list[int]]:
    """count prompts as byte ids: windows of held-out files (the first window of every file, then the
    second, ...), each cut to start at a line; used again from the first when the files run out."""
    _, held_out = stdlib_sources()
    windows = []
    for start in range(0, max(map(len, held_out)), size):
        for data in held_out:
            window = data[start:start + size]
            cut = window.find(b"\n")
            window = window[cut + 1:] if cut >= 0 else window
            if len(window) >= size // 2:
                head = b"\n".join(window.split(b"\n")[:2]) + b"\n"
                windows.append(list(window + MARKER + head))
    return [windows[i % len(windows)] for i in range(count)]


def run(llm, prompts: list[list[int]], max_tokens: int) -> dict:
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=max_tokens)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    if outs[0].error:
        raise SystemExit(f"the model rejected a prompt: {outs[0].error}")
    seconds = time.perf_counter() - start
    tokens = sum(len(o["token_ids"]) for o in outs)
    record = {"seconds": round(seconds, 3), "output_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)}
    metrics = [o["metrics"] for o in outs]
    if "num_draft_tokens" in metrics[0]:
        drafted = sum(m["num_draft_tokens"] for m in metrics)
        accepted = sum(m["num_accepted_tokens"] for m in metrics)
        record |= {"draft_tokens": drafted, "accepted_tokens": accepted,
                   "acceptance": round(accepted / max(drafted, 1), 3)}
    return record, [o["token_ids"] for o in outs]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=results_path("code-qwen3"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prompt-bytes", type=int, default=1500)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--lookup", type=int, nargs=2, default=[2, 5], metavar=("MIN", "MAX"))
    parser.add_argument("--out", default=results_path("spec", "code-edit.json"))
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        parser.error(f"--model {args.model!r} is not a model directory (no config.json); train one with "
                     f"`python -m nanovllm.demo.train_code`")
    prompts = code_edit_prompts(max(args.batches), args.prompt_bytes)
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": args.lookup[0],
            "prompt_lookup_max": args.lookup[1]}
    results, tokens = {}, {}
    for name, extra in (("plain", {}), ("ngram", {"speculative_config": spec})):
        llm = LLM(args.model, max_model_len=args.prompt_bytes + 200 + args.max_tokens, gpu_memory_utilization=0.4,
                  **extra)
        run(llm, prompts[:4], 16)                                       # warm-up
        for b in args.batches:
            results.setdefault(b, {})[name], tokens[name, b] = run(llm, prompts[:b], args.max_tokens)
            print(b, name, results[b][name], flush=True)
        llm.shutdown()
        del llm
        gc.collect()
    for b in args.batches:
        r = results[b]
        r["speedup"] = round(r["ngram"]["tokens_per_s"] / r["plain"]["tokens_per_s"], 3)
        r["same_tokens"] = tokens["plain", b] == tokens["ngram", b]
    import torch
    record = {"model": os.path.basename(os.path.normpath(args.model)), "speculative_config": spec,
              "max_tokens": args.max_tokens, "prompt_bytes": sum(map(len, prompts)) // len(prompts),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "by_batch": results, "command": "python " + " ".join(sys.argv)}
    save_record(record, args.out)


if __name__ == "__main__":
    main()
