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
