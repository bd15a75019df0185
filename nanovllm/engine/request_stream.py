"""Requests in, finished outputs out, as they finish: the loop under `generate` and `iter_outputs`.

Requests come from any iterable of (key, prompt, SamplingParams) and are queued lazily, so that a file of
millions of lines never sits in the scheduler at once: new ones are added while fewer than `max_waiting`
sequences wait. Each request's output is yielded as soon as all its completions are done (a request with
n > 1 has n sequences). A bad request (ValueError while queuing) is yielded at once as an error output.
Any exception, KeyboardInterrupt included, and a consumer that stops iterating early, abort the requests
still running and free their blocks: the engine is left as it was before the loop.
"""
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from tqdm.auto import tqdm

from nanovllm.engine.sequence import Sequence
from nanovllm.outputs import RequestOutput

logger = logging.getLogger(__name__)


def prompt_of(prompt):
    """The text or token ids of a prompt given as vLLM takes it ({"prompt": ...} or {"prompt_token_ids": ...}
    dicts included); ValueError for a dict without either."""
    if not isinstance(prompt, dict):
        return prompt
    if "prompt_token_ids" in prompt:
        return prompt["prompt_token_ids"]
    if "prompt" in prompt:
        return prompt["prompt"]
    raise ValueError(f"a prompt dict needs 'prompt' (a string) or 'prompt_token_ids' (a list of ids); got keys "
                     f"{sorted(prompt)}")


def error_output(key, message: str) -> RequestOutput:
    fields = {"text": "", "token_ids": [], "prompt_token_ids": [], "finish_reason": "error", "error": message}
    return RequestOutput(fields, f"rejected-{key}", None)


class Progress:
    """vLLM's bar: requests done, and the finished requests' input and output tokens per second since the
    start (a steady rate); to a file or a pipe it updates every 10 s, not every step."""

    def __init__(self, total: int | None, enabled: bool):
        self.bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True, disable=not enabled,
                        mininterval=0.1 if sys.stderr.isatty() else 10.0)
        self.enabled, self.start, self.tokens_in, self.tokens_out = enabled, time.perf_counter(), 0, 0

    def count(self, seq: Sequence) -> None:
        self.tokens_in += seq.num_prompt_tokens
        self.tokens_out += seq.num_completion_tokens

    def update(self, requests_done: int) -> None:
        if requests_done and self.enabled:
            wall = max(time.perf_counter() - self.start, 1e-9)
            self.bar.set_postfix_str(f"est. speed input: {self.tokens_in / wall:.2f} toks/s, "
                                     f"output: {self.tokens_out / wall:.2f} toks/s", refresh=False)
            self.bar.update(requests_done)

    def close(self) -> None:
        self.bar.close()


class _Request:
    """One request's completions as they arrive."""

    def __init__(self, key, text: str | None, seqs: list[Sequence]):
        self.key, self.text, self.seqs = key, text, seqs
        self.completions: list[dict | None] = [None] * len(seqs)
        self.left = len(seqs)


def stream_outputs(engine, requests: Iterable[tuple[Any, Any, Any]], use_tqdm: bool = False,
                   total: int | None = None, max_waiting: int | None = None) -> Iterator[tuple[Any, RequestOutput]]:
    """(key, RequestOutput) for every (key, prompt, SamplingParams) of `requests`, in the order they finish."""
    source = iter(requests)
    live: dict[int, tuple[_Request, int]] = {}           # seq_id -> (its request, completion index)
    progress = Progress(total, use_tqdm)
    exhausted = False
    try:
        while True:
            while not exhausted and (max_waiting is None or len(engine.scheduler.waiting) < max_waiting):
                item = next(source, None)
                if item is None:
                    exhausted = True
                    break
                key, prompt, params = item
                try:
                    prompt = prompt_of(prompt)
                    seqs = engine._add_request_n(prompt, params)
                except ValueError as e:
                    logger.warning("request %s rejected: %s", key, e)
                    progress.update(1)
                    yield key, error_output(key, str(e))
                    continue
                request = _Request(key, prompt if isinstance(prompt, str) else None, seqs)
                live.update({seq.seq_id: (request, j) for j, seq in enumerate(seqs)})
            if engine.scheduler.is_finished():
                if exhausted:
                    break
                continue
            for request in _step(engine, live, progress):
                yield request.key, RequestOutput(request.completions, str(request.seqs[0].seq_id), request.text)
        engine._drain()   # a last step may still be in flight for sequences that had finished
    except BaseException:  # GeneratorExit too: a consumer that stops early leaves no request behind
        running = {seq.seq_id: seq for request, _ in live.values() for seq in request.seqs}
        engine.abort(list(running.values()))
        raise
    finally:
        progress.close()


def _step(engine, live: dict, progress: Progress) -> list[_Request]:
    """One engine step; the requests it completes."""
    t = time.perf_counter()
    finished, num_tokens, kind = engine.step()
    engine.stats[f"{kind}_steps"] += 1
    engine.stats[f"{kind}_tokens"] += num_tokens
    engine.stats[f"{kind}_s"] += time.perf_counter() - t
    done = []
    for seq in finished:
        request, j = live.pop(seq.seq_id)
        request.completions[j] = engine.output(seq)
        progress.count(seq)
        request.left -= 1
        if request.left == 0:
            done.append(request)
    progress.update(len(done))
    return done
