"""Run a file of requests in the OpenAI Batch format, as vLLM's run_batch does:

    python -m nanovllm.run_batch -i requests.jsonl -o results.jsonl --model DIR [--max-model-len 4096 ...]

Example input line (one JSON object per line; "/v1/completions" takes "prompt" instead of "messages"):

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64, "temperature": 0}}

Every engine setting of LLM(...) is a --kebab-case flag (--kv-cache-dtype int8, --tensor-parallel-size 2,
--no-enable-prefix-caching). Results are appended to the output file as requests finish, one line each; a
bad line (invalid JSON, unknown url or field, a prompt too long, a duplicate custom_id) gets an error line
and the others still run. Running again with the same output file resumes: custom_ids already written are
skipped, none is written twice. `-` reads stdin / writes stdout. --replicas N runs N engine replicas as
Ray Data actors (`pip install -e ".[ray]"`; --ray-address joins an existing cluster, else a local Ray
starts): nanovllm/batch/ray_data.py.
"""
import argparse
import dataclasses
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator

from tqdm.auto import tqdm

from nanovllm.batch.files import Admission, ResultWriter, count_lines, done_custom_ids, input_lines
from nanovllm.batch.openai_format import BadRequest, parse_line, result_line
from nanovllm.config import Config


def parsed_requests(lines: Iterable[str], tokenizer, max_model_len: int, admission: Admission) -> Iterator:
    """(request, prompt, SamplingParams) of every line to run; error lines for the rest, written at once."""
    for number, line in enumerate(lines, start=1):
        try:
            request = parse_line(line, tokenizer, max_model_len)
        except BadRequest as e:
            admission.reject(e.custom_id or f"line-{number}", str(e), e.code)
            continue
        if admission.admit(request.custom_id):
            yield request, request.prompt, request.params


def run_local(args, engine_kwargs: dict, writer: ResultWriter, done: set[str], duplicates: Counter,
              total: int | None) -> None:
    from nanovllm import LLM
    llm = LLM(args.model, **engine_kwargs)
    model_name = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    bar = tqdm(total=total, desc="Requests", disable=args.disable_progress_bar, dynamic_ncols=True,
               mininterval=0.5 if sys.stderr.isatty() else 10.0)
    start, before = time.perf_counter(), writer.lines
    requests = parsed_requests(input_lines(args.input), llm.tokenizer, llm.config.max_model_len,
                               Admission(done, duplicates, writer))
    for request, output in llm.iter_outputs(requests):
        writer.write(result_line(request, output, model_name, llm.tokenizer))
        bar.update(writer.lines - before - bar.n)
        bar.set_postfix_str(f"{writer.completion_tokens / max(time.perf_counter() - start, 1e-9):,.0f} output "
                            f"tok/s", refresh=False)
    bar.update(writer.lines - before - bar.n)
    bar.close()
    llm.shutdown()


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """Every Config field as a --kebab-case flag (default: Config's)."""
    group = parser.add_argument_group("engine settings (LLM(...) keywords)")
    for f in dataclasses.fields(Config):
        if f.name in ("model", "hf_config", "eos_token_ids"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            kind = type(f.default) if isinstance(f.default, (int, float)) else str
            group.add_argument(flag, type=kind, default=None, metavar=f.name.upper())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nanovllm.run_batch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--input", required=True, help="JSONL file of requests, or - for stdin")
    parser.add_argument("-o", "--output", required=True, help="JSONL file of results (appended), or - for stdout")
    parser.add_argument("--model", required=True, help="a local checkpoint directory")
    parser.add_argument("--served-model-name", default=None, help="the 'model' field of the results")
    parser.add_argument("--replicas", type=int, default=1, help="engine replicas (> 1 runs through Ray Data)")
    parser.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local one)")
    parser.add_argument("--disable-progress-bar", action="store_true")
    add_engine_flags(parser)
    args = parser.parse_args(argv)
    engine_kwargs = {f.name: getattr(args, f.name) for f in dataclasses.fields(Config)
                     if getattr(args, f.name, None) is not None and f.name != "model"}
    if args.input != "-" and not os.path.isfile(args.input):
        parser.error(f"--input {args.input!r} is not a file")
    if args.replicas < 1:
        parser.error(f"--replicas must be >= 1, got {args.replicas}")
    if not os.path.isfile(os.path.join(os.path.expanduser(args.model), "config.json")):
        parser.error(f"--model {args.model!r} is not a checkpoint directory (no config.json)")
    done, duplicates = done_custom_ids(args.output)
    total = count_lines(args.input)
    writer = ResultWriter(args.output)
    start = time.perf_counter()
    try:
        if args.replicas > 1 or args.ray_address:
            from nanovllm.batch.ray_data import run_with_ray
            run_with_ray(args, engine_kwargs, writer, done, duplicates)
        else:
            run_local(args, engine_kwargs, writer, done, duplicates,
                      None if total is None else total - len(done) - sum(duplicates.values()))
    except (ValueError, ImportError) as e:      # an engine setting LLM(...) refuses; Ray not installed
        parser.error(str(e))
    finally:
        writer.close()
    seconds = time.perf_counter() - start
    print(f"run_batch: {writer.lines} results ({writer.errors} errors, {len(done)} done before), "
          f"{writer.prompt_tokens:,} prompt and {writer.completion_tokens:,} completion tokens in {seconds:.1f} s "
          f"({writer.completion_tokens / max(seconds, 1e-9):,.0f} completion tok/s)", file=sys.stderr)


if __name__ == "__main__":
    main()
