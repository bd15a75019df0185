"""Quality of every compression we ship, on a trained model and held-out text (issue 42):

    python benchmarks/quality_table.py --model DIR [--tokens 32768] [--out FILE]

DIR is a byte-level model from `python -m nanovllm.demo.train_code` (its held-out split is the text: the
standard-library files it never trained on). Rows: the model's own dtype (the reference), INT8 KV, FP8 KV,
4-bit AWQ from our quantizer (activation-aware scale search on training-split text) and plain
round-to-nearest 4-bit (`--method rtn`). Columns: perplexity over --tokens held-out tokens (1,024-token
windows, half overlapping), and against the reference on 8 held-out prompts of 256 tokens with 128 greedy
tokens: greedy token agreement, teacher-forced top-1 agreement and mean KL (benchmarks/verify_kv_quant.py).
"""
import argparse
import gc
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository root
from benchmarks.verify_kv_quant import compare  # noqa: E402
from nanovllm import LLM  # noqa: E402
from nanovllm.demo.train_code import as_ids, stdlib_sources  # noqa: E402
from nanovllm.quant.awq_quantize import quantize_checkpoint  # noqa: E402
from nanovllm.tools.perplexity import perplexity  # noqa: E402
from nanovllm.utils.results import results_path, save_record  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=results_path("code-qwen3"))
    parser.add_argument("--tokens", type=int, default=32768, help="held-out tokens scored for perplexity")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--group-size", type=int, default=128, help="4-bit rows: weights per scale")
    parser.add_argument("--out", default=results_path("quality", "code-model.json"))
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        parser.error(f"--model {args.model!r} is not a model directory (no config.json); train one with "
                     f"`python -m nanovllm.demo.train_code`")
    train, held_out = stdlib_sources()
    ids = as_ids(held_out)[:args.tokens].tolist()
    prompts = [ids[i:i + 256] for i in range(0, len(ids) - 256, max(256, len(ids) // args.prompts))][:args.prompts]
    calib = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    calib.write(str(as_ids(train[:8])[:4096].tolist()))       # the quantizer's calibration: training text
    calib.close()
    work = tempfile.mkdtemp(prefix="quality-")
    rows = {"reference": ({}, args.model), "int8 KV": ({"kv_cache_dtype": "int8"}, args.model),
            "fp8 KV": ({"kv_cache_dtype": "fp8"}, args.model),
            "AWQ 4-bit": ({}, lambda: quantize_checkpoint(args.model, os.path.join(work, "awq"), "awq",
                                                          args.group_size, calib.name)),
            "RTN 4-bit": ({}, lambda: quantize_checkpoint(args.model, os.path.join(work, "rtn"), "rtn",
                                                          args.group_size))}
    kw = dict(max_model_len=max(args.window, 256 + args.max_tokens) + 1, gpu_memory_utilization=0.3)
    ref = LLM(args.model, **kw)
    table = {}
    for name, (settings, model) in rows.items():
        llm = ref if name == "reference" else LLM(model() if callable(model) else model, **settings, **kw)
        table[name] = perplexity(llm, ids, args.window)
        if llm is not ref:
            table[name] |= compare(ref, llm, prompts, args.max_tokens)
            llm.shutdown()
            del llm
            gc.collect()
        print(name, table[name], flush=True)
    import torch
    save_record({"model": os.path.basename(os.path.normpath(args.model)), "held_out_tokens": len(ids),
                 "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                 "rows": table, "command": "python " + " ".join(sys.argv)}, args.out)


if __name__ == "__main__":
    main()
