"""Train the demo model: a tiny Qwen3 that memorizes the Zen of Python (PEP 20, public domain).

    python -m nanovllm.demo.train [--out DIR] [--steps N]

It writes to results/zen-qwen3 (untracked); `--out nanovllm/demo/zen-qwen3` replaces the committed model.

The text ships with Python (`import this`); the tokenizer is byte-level. Training uses transformers'
Qwen3 on the CPU (about a minute on 2 cores); the weights are saved in bf16 as safetensors.
"""
import argparse
import codecs
import contextlib
import io
import os

import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from nanovllm.demo import DEMO_MODEL_DIR
from nanovllm.demo.byte_tokenizer import build_byte_tokenizer
from nanovllm.utils.results import results_path


def zen_of_python() -> str:
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13") + "\n"


def demo_config() -> Qwen3Config:
    return Qwen3Config(vocab_size=320, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                       tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0, eos_token_id=256,
                       bos_token_id=256, pad_token_id=256, dtype="bfloat16",
                       nanovllm_demo="zen-of-python")   # example.py recognises the demo by this mark


def train(steps: int, seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    tokenizer = build_byte_tokenizer()
    ids = torch.tensor([tokenizer.eos_token_id] + tokenizer.encode(zen_of_python()) + [tokenizer.eos_token_id])
    model = Qwen3ForCausalLM(demo_config()).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    window, batch = 192, 16
    for step in range(steps):
        starts = torch.randint(0, len(ids) - window, (batch,))
        starts[0] = 0   # always include the opening, so the model also learns to start from EOS
        x = torch.stack([ids[s:s + window] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    return model.eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=results_path("zen-qwen3"),
                        help=f"default: results/zen-qwen3 (untracked); the committed demo is {DEMO_MODEL_DIR}")
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    model = train(args.steps)
    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(eos_token_id=256, pad_token_id=256).save_pretrained(args.out)
    build_byte_tokenizer().save_pretrained(args.out)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
