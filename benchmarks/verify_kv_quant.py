"""Quality of a quantized KV cache against the model-dtype cache, measured on the same prompts.

    python benchmarks/verify_kv_quant.py [--model DIR | --dummy Qwen3-0.6B] [--kv-cache-dtype int8 fp8]

1. Greedy generation with both caches: token agreement and the position of the first divergence.
2. Teacher-forced on the model-dtype output (prompt + its greedy continuation as one prefill, so every
   position attends through the quantized cache): mean KL(reference || quantized) of the next-token
   distributions and their top-1 agreement. Distributions are full-vocabulary log_softmax in float32.
Writes JSON under benchmark_results/kv_int8_cache/.
"""
import argparse
import json
import os
import random
import sys
from datetime import datetime, timezone

import torch

from nanovllm import LLM, SamplingParams
from nanovllm.configs import shipped_config_dir
from nanovllm.demo import DEMO_MODEL_DIR
from nanovllm.engine.scheduler import ScheduledBatch
from nanovllm.engine.sequence import Sequence
from nanovllm.utils.results import results_path


@torch.inference_mode()
def teacher_forced_logprobs(llm: LLM, token_ids: list[int], slice_rows: int = 256) -> torch.Tensor:
    """[len(token_ids) - 1, vocab] float32: row p is log p(. | token_ids[:p + 1]), from one prefill."""
    seq = Sequence(token_ids)
    manager = llm.scheduler.block_manager
    manager.allocate(seq)
    seq.num_computed_tokens = 0           # compute every position, cached or not
    try:
        hidden, _, _ = llm.model_runner._forward(ScheduledBatch([seq], [len(seq)]))
        rows = [llm.model_runner.model.compute_logits(hidden[i:i + slice_rows]).float().log_softmax(-1)
                for i in range(0, len(token_ids) - 1, slice_rows)]
    finally:
        manager.deallocate(seq)
    return torch.cat(rows)[:len(token_ids) - 1].cpu()


def compare(ref: LLM, quant: LLM, prompts: list[list[int]], max_tokens: int) -> dict:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ref_out = ref.generate(prompts, params, use_tqdm=False)
    quant_out = quant.generate(prompts, params, use_tqdm=False)
    agree, total, divergence, kls, top1 = 0, 0, [], [], []
    for prompt, a, b in zip(prompts, ref_out, quant_out):
        same = [x == y for x, y in zip(a["token_ids"], b["token_ids"])]
        agree, total = agree + sum(same), total + len(same)
        divergence.append(same.index(False) if False in same else len(same))
        ids = prompt + a["token_ids"]
        p, q = teacher_forced_logprobs(ref, ids), teacher_forced_logprobs(quant, ids)
        kls.append((p.exp() * (p - q)).sum(-1))
        top1.append(p.argmax(-1) == q.argmax(-1))
    kl, hits = torch.cat(kls), torch.cat(top1).float()
    return {"greedy_token_agreement": agree / total, "first_divergence_mean": sum(divergence) / len(divergence),
            "first_divergence_min": min(divergence), "teacher_forced_mean_kl": kl.mean().item(),
            "teacher_forced_max_kl": kl.max().item(), "teacher_forced_top1_agreement": hits.mean().item(),
            "num_positions": len(hits)}


def demo_prompts(llm: LLM, n: int) -> list[list[int]]:
    from nanovllm.demo.train import zen_of_python
    lines = [line for line in zen_of_python().splitlines() if line]
    return [llm.tokenizer.encode(line[:12]) for line in lines[:n]]


def random_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(min(vocab, 10000)) for _ in range(rng.randint(64, 512))] for _ in range(n)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEMO_MODEL_DIR)
    parser.add_argument("--dummy", default=None, help="a shipped config (Qwen3-0.6B, Qwen3-8B) with random weights")
    parser.add_argument("--kv-cache-dtype", nargs="+", default=["int8", "fp8"])
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out-dir", default=results_path("kv_int8_cache"))
    args = parser.parse_args()
    model = shipped_config_dir(args.dummy) if args.dummy else args.model
    kw = dict(load_format="dummy" if args.dummy else "auto", max_model_len=1024, enforce_eager=True,
              gpu_memory_utilization=0.4)
    ref = LLM(model, **kw)
    prompts = random_prompts(args.num_prompts, ref.config.hf_config.vocab_size) if args.dummy or not ref.tokenizer \
        else demo_prompts(ref, args.num_prompts)
    os.makedirs(args.out_dir, exist_ok=True)
    for kv_dtype in args.kv_cache_dtype:
        quant = LLM(model, kv_cache_dtype=kv_dtype, **kw)
        record = {"model": os.path.basename(os.path.normpath(model)), "load_format": kw["load_format"],
                  "kv_cache_dtype": kv_dtype, "reference": str(ref.config.dtype).replace("torch.", ""),
                  "device": ref.config.device, **compare(ref, quant, prompts, args.max_tokens),
                  "kv_capacity_ratio": ref.model_runner.block_bytes() / quant.model_runner.block_bytes(),
                  "command": "python " + " ".join(sys.argv),
                  "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        print(json.dumps(record))
        name = f"quality-{record['model']}-{kv_dtype}-{record['device']}.json"
        with open(os.path.join(args.out_dir, name), "w") as f:
            json.dump(record, f, indent=2)
        quant.shutdown()
        del quant


if __name__ == "__main__":
    main()
