"""Engine replicas over Ray Data, for files larger than one machine serves (`pip install -e ".[ray]"`).

The driver reads the batch file, drops the lines already in the output (resume) and writes the error
lines of bad and duplicate ones itself; the rest become a Ray dataset. `map_batches` runs them through
`EngineReplica` actors, one LLM each (`tensor_parallel_size` GPUs per replica; Ray places the actors and
streams blocks of lines to them), and the driver appends each result line as it comes back. What Ray
gives that nanovllm does not write: scheduling actors onto machines and GPUs, moving the data to them,
back-pressure, and restarting a failed actor. Ray Data users who already hold a dataset of request lines
call `map_request_lines` on it.
"""
import json
import os

import numpy as np

from nanovllm.batch.files import Admission, input_lines
from nanovllm.batch.openai_format import BadRequest, error_line, parse_line, result_line

LINES_PER_BATCH = 256      # request lines handed to a replica at a time: enough to keep its batch full


class EngineReplica:
    """A Ray Data actor: one LLM; a batch of request lines in, a batch of result lines out."""

    def __init__(self, model: str, engine_kwargs: dict, served_model_name: str | None = None):
        from nanovllm import LLM
        self.llm = LLM(model, **engine_kwargs)
        self.model_name = served_model_name or os.path.basename(os.path.normpath(model))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        llm, results, runnable = self.llm, [], []
        for line in batch["line"]:
            try:
                request = parse_line(str(line), llm.tokenizer, llm.config.max_model_len)
            except BadRequest as e:
                results.append(error_line(e.custom_id, str(e), e.code))
                continue
            runnable.append(request)
        outputs = llm.generate([r.prompt for r in runnable], [r.params for r in runnable], use_tqdm=False)
        results += [result_line(request, output, self.model_name, llm.tokenizer)
                    for request, output in zip(runnable, outputs)]
        return {"result": np.array([json.dumps(r, ensure_ascii=False) for r in results], dtype=object)}


def map_request_lines(ds, model: str, replicas: int = 1, engine_kwargs: dict | None = None,
                      served_model_name: str | None = None, num_gpus_per_replica: float | None = None):
    """A dataset with a "line" column of OpenAI Batch request lines -> one with a "result" column of output
    lines, through `replicas` engine actors."""
    engine_kwargs = engine_kwargs or {}
    if num_gpus_per_replica is None:
        import torch
        cuda = engine_kwargs.get("device", "auto") != "cpu" and torch.cuda.is_available()
        num_gpus_per_replica = engine_kwargs.get("tensor_parallel_size", 1) if cuda else 0
    return ds.map_batches(EngineReplica, fn_constructor_kwargs={"model": model, "engine_kwargs": engine_kwargs,
                                                                "served_model_name": served_model_name},
                          batch_size=LINES_PER_BATCH, concurrency=replicas, num_gpus=num_gpus_per_replica,
                          batch_format="numpy")


def pending_lines(path: str, done: set[str], duplicates, writer) -> list[str]:
    """The input lines still to run; error lines for JSON without a custom_id and for repeated ids."""
    admission, lines = Admission(done, duplicates, writer), []
    for number, line in enumerate(input_lines(path), start=1):
        try:
            custom_id = json.loads(line).get("custom_id")
        except (json.JSONDecodeError, AttributeError):
            custom_id = None
        if not isinstance(custom_id, str) or not custom_id:     # the replicas could not name its error line
            admission.reject(f"line-{number}", "the line is not a JSON object with a non-empty custom_id string")
        elif admission.admit(custom_id):
            lines.append(line)
    return lines


def run_with_ray(args, engine_kwargs: dict, writer, done: set[str], duplicates) -> None:
    """run_batch's --replicas path: results appended as they stream back from the replicas."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise ImportError('--replicas needs Ray: pip install -e ".[ray]"') from None
    lines = pending_lines(args.input, done, duplicates, writer)
    if not lines:
        return
    ray.init(address=args.ray_address, ignore_reinit_error=True, log_to_driver=False,
             include_dashboard=False)
    try:
        ds = ray.data.from_items([{"line": line} for line in lines])
        results = map_request_lines(ds, args.model, args.replicas, engine_kwargs, args.served_model_name)
        for row in results.iter_rows():
            writer.write(json.loads(row["result"]))
    finally:
        ray.shutdown()
