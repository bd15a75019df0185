"""The batch files themselves: reading request lines, appending result lines, resuming after a crash."""
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator

from nanovllm.batch.openai_format import error_line

DUPLICATE = "duplicate_custom_id"

FSYNC_EVERY_S = 5.0


class ResultWriter:
    """Appends output lines, each flushed at once (and synced to disk every few seconds), and counts them."""

    def __init__(self, path: str):
        if path != "-":
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.file = sys.stdout if path == "-" else open(path, "a", encoding="utf-8")
        self.synced = time.monotonic()
        self.lines = self.errors = self.prompt_tokens = self.completion_tokens = 0

    def write(self, line: dict) -> None:
        self.file.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.file.flush()
        self.lines += 1
        if line["error"] is not None:
            self.errors += 1
        else:
            usage = line["response"]["body"]["usage"]
            self.prompt_tokens += usage["prompt_tokens"]
            self.completion_tokens += usage["completion_tokens"]
        if self.file is not sys.stdout and time.monotonic() - self.synced > FSYNC_EVERY_S:
            os.fsync(self.file.fileno())
            self.synced = time.monotonic()

    def close(self) -> None:
        if self.file is not sys.stdout:
            self.file.close()


def done_custom_ids(path: str) -> tuple[set[str], Counter]:
    """(custom_ids already answered in an output file, which a resumed run skips; how many "duplicate
    custom_id" error lines it holds per id, which it does not write again). A duplicate's error line does
    not mark its id done: the first occurrence may still have been running. A last line cut short by a
    crash is removed, so that the file stays one JSON object per line."""
    done, duplicates = set(), Counter()
    if path == "-" or not os.path.exists(path):
        return done, duplicates
    with open(path, "rb+") as f:
        data = f.read()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            f.truncate(complete)
    for raw in data[:complete].splitlines():
        try:
            line = json.loads(raw)
            custom_id, error = line["custom_id"], line["error"]
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        if error is not None and error.get("code") == DUPLICATE:
            duplicates[custom_id] += 1
        else:
            done.add(custom_id)
    return done, duplicates


def input_lines(path: str) -> Iterator[str]:
    """The request lines (blank lines are not requests and are not counted)."""
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
    try:
        for line in stream:
            if line.strip():
                yield line
    finally:
        if stream is not sys.stdin:
            stream.close()


def count_lines(path: str) -> int | None:
    if path == "-":
        return None
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def duplicate_line(custom_id: str) -> dict:
    return error_line(custom_id, f"custom_id {custom_id!r} appears more than once in the input; each must be "
                                 f"unique", DUPLICATE)


class Admission:
    """Which custom_ids of the input run: one answered in the output (a resumed run) is skipped; a repeated
    one gets one "duplicate" error line, unless the run being resumed already wrote it."""

    def __init__(self, done: set[str], duplicates: Counter, writer: ResultWriter):
        self.done, self.duplicates, self.writer, self.seen = done, duplicates, writer, set()

    def admit(self, custom_id: str) -> bool:
        if custom_id in self.done:
            return False
        if custom_id in self.seen:
            if self.duplicates[custom_id]:
                self.duplicates[custom_id] -= 1
            else:
                self.writer.write(duplicate_line(custom_id))
            return False
        self.seen.add(custom_id)
        return True

    def reject(self, custom_id: str, message: str, code: str = "invalid_request") -> None:
        """An error line for a line that cannot run, unless the output already holds it."""
        if custom_id not in self.done:
            self.writer.write(error_line(custom_id, message, code))
