"""The fused MoE kernels at Qwen3-30B-A3B's sizes, per launch setting: `python benchmarks/bench_moe.py`.

For each token count, ROUTINGS random router picks (distinct experts per token, as routing gives) over one
layer's experts (128 x 768 x 2048 bf16); times fused_moe (gate_up + down + the sum) once per routing, all in
one CUDA graph as the engine's decode runs it (eagerly, a 1-8 token call times the host's launches: the
first sweep on the H100 measured ~100 us at one token, where the engine's profile shows 34 us), under every
setting in --settings (a setting may also move the most pairs that skip the sort, e.g. per_pair=64, or
be only that), and reports the bytes of the experts each call touches per microsecond against the
measured copy rate. Prints one JSON line per token count and setting, then the best setting per count.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository root
from bench import measured_rates  # noqa: E402
from benchmarks.timing import graph_us  # noqa: E402
from nanovllm.layers.triton_moe import PER_PAIR_MAX_PAIRS, fused_moe  # noqa: E402
from nanovllm.utils.results import save_record  # noqa: E402


def parse_setting(text: str) -> tuple[dict[str, tuple[int, ...]] | None, int]:
    """'default', or any of 'gate_up=BN/BK/warps/stages', 'down=BN/BK/warps/stages' (decode: the down GEMM
    and the sum apart), 'down_sum=BN/BK/warps/stages' (decode: both in one launch), 'per_pair=MAX_PAIRS'
    joined by commas -> (launch settings or None for the library's, the most pairs that skip the sort)."""
    if text == "default":
        return None, PER_PAIR_MAX_PAIRS
    parts = dict(part.split("=") for part in text.split(","))
    per_pair = int(parts.pop("per_pair", PER_PAIR_MAX_PAIRS))
    settings = {name: tuple(int(v) for v in value.split("/")) for name, value in parts.items()}
    return settings or None, per_pair


ROUTINGS = 8     # calls per timing, each with its own picks: their experts' weights do not all fit in L2


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 8, 64, 256])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=768)
    parser.add_argument("--settings", nargs="+", default=["default"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    dev, dtype = os.environ.get("BENCH_MOE_DEVICE", "cuda"), torch.bfloat16
    copy_rate = measured_rates(dev)[0]
    w13 = torch.randn(args.experts, 2 * args.inter, args.hidden, dtype=dtype, device=dev) * 0.02
    w2 = torch.randn(args.experts, args.hidden, args.inter, dtype=dtype, device=dev) * 0.02
    expert_bytes = 3 * args.inter * args.hidden * 2
    rows, best = [], {}
    for n in args.tokens:
        x = torch.randn(n, args.hidden, dtype=dtype, device=dev)
        routings = [torch.rand(n, args.experts, device=dev).argsort(dim=1)[:, :args.top_k].to(torch.int32)
                    for _ in range(ROUTINGS)]
        weights = torch.softmax(torch.randn(n, args.top_k, device=dev), dim=-1)
        touched = sum(torch.unique(ids).numel() for ids in routings) * expert_bytes // ROUTINGS
        want = fused_moe(x, w13, w2, weights, routings[0])
        for text in args.settings:
            setting, per_pair = parse_setting(text)
            try:
                got = fused_moe(x, w13, w2, weights, routings[0], setting, per_pair)
                torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
                us = graph_us([lambda ids=ids: fused_moe(x, w13, w2, weights, ids, setting, per_pair)
                               for ids in routings])
            except Exception as e:      # a setting the compiler rejects (shared memory) is reported, not fatal
                rows.append({"tokens": n, "setting": text, "error": str(e)[:200]})
                print(json.dumps(rows[-1]))
                continue
            row = {"tokens": n, "setting": text,
                   "us": round(us, 2), "experts_touched": touched // expert_bytes,
                   "gb_per_s": round(touched / us / 1e3, 1), "of_copy_rate": round(touched / us / 1e-6 / copy_rate, 3)}
            rows.append(row)
            print(json.dumps(row))
            if n not in best or us < best[n]["us"]:
                best[n] = row
    record = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else dev, "copy_gb_per_s": round(copy_rate / 1e9, 1),
              "shape": vars(args), "best": best, "rows": rows, "command": "python " + " ".join(sys.argv)}
    print(json.dumps({"best": best}))
    if args.out:
        save_record(record, args.out)


if __name__ == "__main__":
    main()
