"""Benchmark records: every script prints its JSON record and writes it to `--out`, by default under
results/ (untracked; NANOVLLM_RESULTS moves it). benchmark_results/ holds the records the README and docs
cite: a run lands there only when its --out says so."""
import glob
import json
import os


def results_path(*parts: str) -> str:
    """Where a script writes a record nobody asked to keep: results/<parts> (not tracked by git)."""
    return os.path.join(os.environ.get("NANOVLLM_RESULTS", "results"), *parts)


def save_record(record: dict, path: str) -> None:
    print(json.dumps(record))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=2)


def load_records(root: str, pattern: str) -> list[tuple[str, dict]]:
    """(path relative to root's parent, record) for each JSON file matching root/pattern, sorted."""
    records = []
    for path in sorted(glob.glob(os.path.join(root, pattern))):
        with open(path) as f:
            records.append((os.path.relpath(path, os.path.dirname(root)), json.load(f)))
    return records


HEADLINE_MODEL = "Qwen3-0.6B"   # bench.py's default model: the README's table and charts show it
WORKLOAD_ORDER = ("random", "short", "long", "prefix", "prefix + cascade", "sharegpt")


def workload_label(record: dict) -> str:
    """A bench record's workload, "+ cascade" when cascade attention was on for the workload whose prompts
    share a prefix (elsewhere it changes nothing: no step shares a block), the KV block size if not the
    default."""
    settings, workload = record.get("settings", {}), record.get("workload", "random")
    block = f" (blocks of {settings['kvcache_block_size']})" if settings.get("kvcache_block_size") else ""
    cascade = " + cascade" if workload == "prefix" and settings.get("enable_cascade_attention") else ""
    return workload + cascade + block


def latest_bench(root: str) -> dict[str, dict[tuple[str, str], dict]]:
    """GPU -> (workload label, KV dtype) -> the newest nanovllm record of HEADLINE_MODEL with default engine
    settings."""
    table: dict[str, dict[tuple[str, str], dict]] = {}
    for _, r in load_records(root, "bench/*.json"):
        settings = r.get("settings", {})
        if (r.get("engine") != "nanovllm" or settings.get("max_num_seqs") or settings.get("kvcache_block_size")
                or r.get("model") != HEADLINE_MODEL):
            continue
        key = (workload_label(r), settings.get("kv_cache_dtype", "auto"))
        slot = table.setdefault(r["gpu"], {})
        if key not in slot or r["date"] > slot[key]["date"]:
            slot[key] = r
    return table
