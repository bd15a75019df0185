"""Sampling microbenchmark: GPU time to draw one token per row from Qwen3's 151,936 logits (bf16, T = 0.6).

    python benchmarks/bench_sampler.py

Three ways, timed with the PyTorch profiler (kernel time only, summed per call; the host's launch cost is
left out, as the engine overlaps it with the GPU):
  - "inverse_cdf": the engine's sampler (layers/triton_sampler.py: chunk statistics, then one chunk scanned).
  - "gumbel": the noise-per-logit way the sampler used before, for comparison: E ~ Exp(1) for every
    logit, then one compiled kernel takes argmax(logits / T - log E).
  - "argmax": greedy decoding's torch.argmax, one read of the logits and nothing else.
Writes results/sampler/sampler.json (untracked), or the path given as its one argument.
"""
import sys
from datetime import datetime, timezone

import torch
from torch.profiler import ProfilerActivity, profile

from nanovllm.layers.sampler import Sampler, SamplingTensors
from nanovllm.utils.results import results_path, save_record

VOCAB, TEMPERATURE, CALLS = 151936, 0.6, 20


@torch.compile(dynamic=True)
def gumbel_argmax(logits: torch.Tensor, temperatures: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    return (logits.float() / temperatures[:, None] - noise.clamp(min=1e-10).log()).argmax(dim=-1)


def kernel_us(fn) -> float:
    """GPU microseconds per call: the sum of the kernels' durations over CALLS calls, divided by CALLS."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    spans = [e.time_range for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(r.end - r.start for r in spans) / CALLS


def main():
    torch.manual_seed(0)
    rows_timed = {}
    for rows in (256, 64, 1):
        logits = torch.randn(rows, VOCAB, device="cuda", dtype=torch.bfloat16) * 3
        temps = torch.full((rows,), TEMPERATURE, device="cuda")
        params = SamplingTensors(temps, torch.full_like(temps, VOCAB), torch.ones_like(temps),
                                 torch.zeros_like(temps), [None] * rows, needs_filter=False, all_greedy=False)
        noise = torch.empty_like(logits, dtype=torch.float32)
        ways = {"inverse_cdf": lambda: Sampler()(logits, params),
                "gumbel": lambda: gumbel_argmax(logits, temps, noise.exponential_()),
                "argmax": lambda: logits.argmax(dim=-1)}
        rows_timed[rows] = {name: round(kernel_us(fn), 1) for name, fn in ways.items()}
        print(rows, rows_timed[rows], flush=True)
    save_record({"vocab": VOCAB, "dtype": "bfloat16", "temperature": TEMPERATURE, "kernel_us_per_call": rows_timed,
                 "gpu": torch.cuda.get_device_name(), "command": "python " + " ".join(sys.argv),
                 "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
                sys.argv[1] if len(sys.argv) > 1 else results_path("sampler", "sampler.json"))


if __name__ == "__main__":
    main()
