"""Train a small code model on text every machine has, for quality figures and speculative decoding that
mean something (issue 42):

    python -m nanovllm.demo.train_code [--out DIR] [--size base|tiny] [--minutes 7] [--steps N]

Data: the Python standard library's own .py sources (this interpreter's), files sorted by path and split by
file into train and held-out (1 in 20, by a hash of the path, so the split never depends on the machine's
file order). Tokenizer: the demo's byte-level one. Model: a Qwen3-shaped decoder, "base" ~76M parameters
(hidden 768, 12 layers, 12 heads, 4 KV heads, SwiGLU 2048), "tiny" for tests. Training: AdamW, cosine decay
after a warm-up, 1,024-byte windows, bf16 autocast on CUDA, until --minutes of wall time or --steps; a fixed
seed. When the time budget ends first, the decay follows the clock (the run still ends at a low learning
rate), so its steps depend on the machine's speed; --steps with a generous --minutes gives a run that
repeats step for step. Written to --out (default results/code-qwen3, untracked): the weights (bf16
safetensors), config (marked "nanovllm_trained": "stdlib-code"), tokenizer, and training.json with the loss
curve (and learning rate) and the held-out loss (training.png beside it when matplotlib is installed). The
weights are made where they are used; they are not committed.
"""
import argparse
import glob
import json
import math
import os
import sysconfig
import time
import zlib

import torch
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from nanovllm.demo.byte_tokenizer import build_byte_tokenizer
from nanovllm.utils.results import results_path

SIZES = {
    "base": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=4, head_dim=64),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16),
}
EOS = 256


def stdlib_sources(limit_bytes: int | None = None) -> tuple[list[bytes], list[bytes]]:
    """(train files, held-out files) of the standard library's .py sources, as bytes."""
    root = sysconfig.get_paths()["stdlib"]
    train, held_out, total = [], [], 0
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        top = os.path.relpath(path, root).split(os.sep)[0]
        if top in ("test", "site-packages", "dist-packages"):     # the test suite is mostly data, not code
            continue
        with open(path, "rb") as f:
            data = f.read()
        rel = os.path.relpath(path, root).encode()
        (held_out if zlib.crc32(rel) % 20 == 0 else train).append(data)
        total += len(data)
        if limit_bytes is not None and total >= limit_bytes:
            break
    if not held_out:      # a tiny limit (tests): hold out the last file read
        held_out.append(train.pop())
    return train, held_out


def as_ids(files: list[bytes]) -> torch.Tensor:
    """Files concatenated as byte ids, each followed by EOS."""
    ids = []
    for data in files:
        if data:      # torch.frombuffer refuses an empty buffer (an empty __init__.py)
            ids.append(torch.frombuffer(bytearray(data), dtype=torch.uint8).long())
        ids.append(torch.tensor([EOS]))
    return torch.cat(ids)


def model_config(size: str) -> Qwen3Config:
    return Qwen3Config(vocab_size=320, max_position_embeddings=4096, tie_word_embeddings=True, rms_norm_eps=1e-6,
                       rope_theta=10000.0, eos_token_id=EOS, bos_token_id=EOS, pad_token_id=EOS, dtype="bfloat16",
                       nanovllm_trained="stdlib-code", **SIZES[size])


def held_out_loss(model, ids: torch.Tensor, window: int, device, max_windows: int = 64) -> float:
    model.eval()
    n = min(max_windows, (len(ids) - 1) // window)
    losses = []
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        for i in range(n):
            x = ids[i * window:(i + 1) * window].unsqueeze(0).to(device)
            losses.append(model(input_ids=x, labels=x).loss.float().item())
    model.train()
    return sum(losses) / max(len(losses), 1)


def train(args) -> dict:
    torch.manual_seed(args.seed)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    train_files, held_files = stdlib_sources(args.limit_bytes)
    train_ids, held_ids = as_ids(train_files), as_ids(held_files)
    model = Qwen3ForCausalLM(model_config(args.size)).float().to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, min(200, args.steps // 10))
    budget_s = 60 * args.minutes

    def lr_at(step: int, elapsed_s: float) -> float:
        """Linear warm-up, then a cosine decay over whichever ends first, the steps or the time budget, so
        that a run cut by --minutes still ends at a low learning rate."""
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = max((step - warmup) / max(1, args.steps - warmup), elapsed_s / budget_s)
        return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    curve, start, step = [], time.perf_counter(), 0
    gen = torch.Generator().manual_seed(args.seed)
    while step < args.steps and time.perf_counter() - start < budget_s:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, time.perf_counter() - start)
        starts = torch.randint(0, len(train_ids) - args.window - 1, (args.batch,), generator=gen)
        x = torch.stack([train_ids[s:s + args.window] for s in starts]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0:
            curve.append({"step": step, "seconds": round(time.perf_counter() - start, 1),
                          "loss": round(loss.item(), 4), "lr": round(opt.param_groups[0]["lr"], 7)})
            print(json.dumps(curve[-1]), flush=True)
        step += 1
    record = {"size": args.size, "parameters": sum(p.numel() for p in model.parameters()), "steps": step,
              "seconds": round(time.perf_counter() - start, 1), "train_bytes": len(train_ids),
              "held_out_bytes": len(held_ids), "held_out_loss": round(held_out_loss(model, held_ids, args.window,
                                                                                    device), 4),
              "curve": curve, "device": str(device), "seed": args.seed}
    save(model, args.out, record)
    return record


def save(model, out: str, record: dict) -> None:
    os.makedirs(out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=EOS, pad_token_id=EOS).save_pretrained(out)
    build_byte_tokenizer().save_pretrained(out)
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(record, f, indent=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([c["step"] for c in record["curve"]], [c["loss"] for c in record["curve"]], label="train")
    ax.axhline(record["held_out_loss"], color="gray", linestyle="--", label="held-out, at the end")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "training.png"), dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=results_path("code-qwen3"))
    parser.add_argument("--size", choices=list(SIZES), default="base")
    parser.add_argument("--minutes", type=float, default=7.0, help="wall-time budget of the training loop")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--limit-bytes", type=int, default=None, help="read only this much source (tests)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    if args.steps < 1 or args.batch < 1 or args.window < 8 or args.minutes <= 0:
        parser.error("--steps and --batch must be >= 1, --window >= 8, --minutes > 0")
    record = train(args)
    print(f"saved to {args.out}: {record['parameters']:,} parameters, {record['steps']} steps in "
          f"{record['seconds']} s, held-out loss {record['held_out_loss']}")


if __name__ == "__main__":
    main()
