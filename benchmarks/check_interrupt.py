"""Ctrl-C during a long generate (issue 44), checked on a GPU:

    python benchmarks/check_interrupt.py [--model DIR] [--after 3] [--out FILE]

One engine greedily answers a few reference prompts, then starts bench.py's short workload (2,048
requests) and gets a real SIGINT `--after` seconds in. It prints how long the KeyboardInterrupt took to
come back, checks the engine holds nothing afterwards (no sequence, every KV block free), and answers the
reference prompts again: their tokens must equal the first answers (a fresh engine's). Exit code 1 if not.
"""
import argparse
import os
import signal
import sys
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository root
from bench import make_workload, resolve_model  # noqa: E402
from nanovllm import LLM, SamplingParams  # noqa: E402
from nanovllm.utils.results import results_path, save_record  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="~/huggingface/Qwen3-0.6B/")
    parser.add_argument("--after", type=float, default=3.0, help="seconds into the long generate")
    parser.add_argument("--out", default=results_path("reliability", "interrupt.json"))
    args = parser.parse_args()
    args.num_seqs, args.max_input_len, args.max_output_len = 256, 1024, 1024
    model, load_format = resolve_model(args.model)
    work = make_workload("short", args)
    llm = LLM(model, load_format=load_format, max_model_len=4096)
    reference = [[7, 8, 9, 10] * k for k in (1, 5, 30)]
    greedy = SamplingParams(temperature=0, ignore_eos=True, max_tokens=64)

    def answer():
        return [o["token_ids"] for o in llm.generate(reference, greedy, use_tqdm=False)]

    before = answer()
    sent = {}

    def send_sigint(*_):
        sent["at"] = time.perf_counter()
        os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGALRM, send_sigint)
    signal.setitimer(signal.ITIMER_REAL, args.after)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in work.max_tokens]
    started = time.perf_counter()
    try:
        llm.generate(work.prompts, params, use_tqdm=False)
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    returned = time.perf_counter()
    scheduler = llm.scheduler
    idle = (not scheduler.waiting and not scheduler.running
            and len(scheduler.block_manager.free_block_ids) == len(scheduler.block_manager.blocks))
    after = answer()
    import torch
    record = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv), "interrupted": interrupted,
              "signal_after_s": round(sent.get("at", returned) - started, 3),
              "returned_after_signal_ms": round(1e3 * (returned - sent.get("at", returned)), 1),
              "engine_idle_after": idle, "same_tokens_as_fresh": after == before}
    save_record(record, args.out)
    sys.exit(0 if interrupted and idle and after == before else 1)


if __name__ == "__main__":
    main()
