"""Charts of the benchmark records (PNG, rendered from the JSON under benchmark_results/, never typed):
`python -m nanovllm.tools.render_results --charts` (needs matplotlib: `pip install -e ".[plot]"`).

- throughput.png: tokens/s of every workload per KV cache dtype, one panel per GPU, each bar labelled
  with its ratio to the workload's physical floor (bench.py);
- awq_vs_bf16.png: batch-1 time per output token and batch-256 throughput, AWQ 4-bit against bf16;
- decode_attention.png: the decode kernel's cache-read bandwidth per KV dtype against the GPU's copy rate.
"""
import os

from nanovllm.utils.results import WORKLOAD_ORDER, latest_bench, load_records

KV_COLORS = {"auto": "#4c72b0", "int8": "#dd8452", "fp8": "#55a868"}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("charts need matplotlib: pip install -e \".[plot]\"") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def throughput_chart(root: str, out: str) -> None:
    plt = _pyplot()
    table = latest_bench(root)
    fig, axes = plt.subplots(1, len(table), figsize=(6 * len(table), 4), squeeze=False)
    for ax, (gpu, records) in zip(axes[0], sorted(table.items())):
        workloads = [w for w in WORKLOAD_ORDER if any(k[0] == w for k in records)]
        kinds = [k for k in KV_COLORS if any(key[1] == k for key in records)]
        width = 0.8 / len(kinds)
        for j, kind in enumerate(kinds):
            for i, workload in enumerate(workloads):
                r = records.get((workload, kind))
                if r is None:
                    continue
                x = i + (j - (len(kinds) - 1) / 2) * width
                ax.bar(x, r["tokens_per_s"], width, color=KV_COLORS[kind], label=kind if i == 0 else None)
                if r.get("seconds_over_floor"):
                    ax.text(x, r["tokens_per_s"], f"{r['seconds_over_floor']:.1f}x", ha="center", va="bottom",
                            fontsize=7)
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_yscale("log")
        ax.set_ylim(bottom=1e3)        # bars on a log axis start at 1,000 tokens/s in every panel
        ax.set_ylabel("output tokens/s (log scale)")
        ax.set_title(f"{gpu}: throughput by workload (label: x floor)", fontsize=9)
        ax.legend(title="KV cache", fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def awq_chart(root: str, out: str) -> None:
    plt = _pyplot()
    newest: dict[tuple[str, str], tuple[str, dict]] = {}     # (model, GPU) -> (date, row) of the newest record
    for _, record in load_records(root, "quantization_int_4/awq_vs_bf16*.json"):
        for r in record["rows"]:
            key = (r["model"], r["bf16"]["gpu"])
            if key not in newest or record.get("date", "") > newest[key][0]:
                newest[key] = (record.get("date", ""), r)
    rows = [row for _, (_, row) in sorted(newest.items())]
    fig, (tpot, speed) = plt.subplots(1, 2, figsize=(10, 3.5))
    models = [f"{r['model']}\n{r['bf16']['gpu'].split()[1]}" for r in rows]
    for j, weights in enumerate(("bf16", "awq")):
        xs = [i + (j - 0.5) * 0.4 for i in range(len(rows))]
        tpot.bar(xs, [r[weights]["tpot_ms_batch1"] for r in rows], 0.4, label=weights)
        speed.bar(xs, [(r[weights].get("throughput") or {}).get("tokens_per_s", 0) for r in rows], 0.4,
                  label=weights)
    for ax, title in ((tpot, "time per output token, batch 1 (ms)"), (speed, "tokens/s, 256 requests")):
        ax.set_xticks(range(len(models)), models, fontsize=8)
        ax.set_title(f"AWQ 4-bit vs bf16: {title}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def copy_rates(root: str) -> dict[str, float]:
    """GPU -> the copy rate (bytes/s) bench.py measured there (its newest record)."""
    rates = {}
    for gpu, records in latest_bench(root).items():
        measured = [r for r in records.values() if "floor" in r]
        if measured:
            rates[gpu] = max(measured, key=lambda r: r["date"])["floor"]["copy_bytes_per_s"]
    return rates


def decode_attention_chart(root: str, out: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.5))
    labels, values, colors = [], [], []
    for path, records in load_records(root, "kv_int8_cache/decode-attention-*.json"):
        for r in records:
            context = str(r["context"]) if r.get("context_min") is None else f"{r['context_min']}..{r['context']}"
            labels.append(f"{r['kv_cache_dtype']}\n{r['batch']}x{context}\n{r.get('gpu', '?').split()[1]}")
            values.append(r["tb_per_s"])
            colors.append(KV_COLORS.get(r["kv_cache_dtype"], "gray"))
    ax.bar(range(len(values)), values, color=colors)
    ax.set_xticks(range(len(values)), labels, fontsize=6)
    for (gpu, rate), style in zip(sorted(copy_rates(root).items()), ("--", ":", "-.")):
        ax.axhline(rate / 1e12, color="black", linestyle=style, linewidth=1,
                   label=f"{gpu} copy rate ({rate / 1e12:.2f} TB/s, bench.py)")
    ax.set_ylabel("TB/s of KV cache read")
    ax.set_title("decode attention: cache-read bandwidth", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def render_charts(root: str = "benchmark_results") -> list[str]:
    """Write the charts under root/charts/; returns their paths."""
    os.makedirs(os.path.join(root, "charts"), exist_ok=True)
    written = []
    for name, draw in (("throughput.png", throughput_chart), ("awq_vs_bf16.png", awq_chart),
                       ("decode_attention.png", decode_attention_chart)):
        path = os.path.join(root, "charts", name)
        draw(root, path)
        written.append(path)
    return written
