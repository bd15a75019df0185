"""run_batch's overhead: the same requests through LLM.generate and through run_batch's loop (parse the
JSONL, feed the engine lazily, format and append each result line), one engine, one process:

    python benchmarks/bench_run_batch.py [--workload short] [--model DIR] [--out FILE]

The requests are bench.py's workload as /v1/completions lines with token-id prompts (temperature 0.6,
ignore_eos, each its own max_tokens). Prints tok/s of both and their ratio (issue 38: >= 0.9).
"""
import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository root
from bench import WORKLOADS, make_workload, resolve_model  # noqa: E402
from nanovllm import LLM, SamplingParams  # noqa: E402
from nanovllm.batch.files import Admission, ResultWriter, input_lines  # noqa: E402
from nanovllm.batch.openai_format import result_line  # noqa: E402
from nanovllm.run_batch import parsed_requests  # noqa: E402
from nanovllm.utils.results import results_path, save_record  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=WORKLOADS, default="short")
    parser.add_argument("--model", default="~/huggingface/Qwen3-0.6B/")
    parser.add_argument("--out", default=results_path("run_batch", "overhead.json"))
    args = parser.parse_args()
    args.num_seqs, args.max_input_len, args.max_output_len = 256, 1024, 1024     # the random workload's
    model, load_format = resolve_model(args.model)
    w = make_workload(args.workload, args)
    llm = LLM(model, load_format=load_format, max_model_len=max(4096, max(len(p) + n for p, n in
                                                                          zip(w.prompts, w.max_tokens))))
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in w.max_tokens]
    llm.generate(w.prompts[:8], [SamplingParams(max_tokens=8)] * 8, use_tqdm=False)      # warm-up
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outs = llm.generate(w.prompts, params, use_tqdm=False)
    generate_s = time.perf_counter() - start
    tokens = sum(len(o["token_ids"]) for o in outs)
    llm.reset_prefix_cache()
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
        with open(src, "w") as f:
            for i, (prompt, n) in enumerate(zip(w.prompts, w.max_tokens)):
                f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                                    "body": {"prompt": prompt, "max_tokens": n, "temperature": 0.6,
                                             "ignore_eos": True}}) + "\n")
        writer = ResultWriter(dst)
        start = time.perf_counter()
        admission = Admission(set(), Counter(), writer)
        requests = parsed_requests(input_lines(src), llm.tokenizer, llm.config.max_model_len, admission)
        for request, output in llm.iter_outputs(requests):
            writer.write(result_line(request, output, "bench", llm.tokenizer))
        batch_s = time.perf_counter() - start
        writer.close()
    assert writer.completion_tokens == tokens and writer.errors == 0
    record = {"workload": args.workload, "requests": len(w.prompts), "output_tokens": tokens,
              "generate_tok_per_s": round(tokens / generate_s), "run_batch_tok_per_s": round(tokens / batch_s),
              "ratio": round(generate_s / batch_s, 3), "gpu": llm.config.device == "cuda" and
              __import__("torch").cuda.get_device_name(), "command": "python " + " ".join(sys.argv),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    save_record(record, args.out)


if __name__ == "__main__":
    main()
