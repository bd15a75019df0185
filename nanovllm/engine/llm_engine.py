"""The generate loop: validate and tokenize requests, schedule, run, check stop conditions, detokenize."""
import dataclasses
import logging
import operator
import os
import time

from transformers import AutoTokenizer

from nanovllm.config import Config
from nanovllm.engine.model_runner import ModelRunner
from nanovllm.engine.request_stream import stream_outputs
from nanovllm.engine.scheduler import Scheduler
from nanovllm.engine.sequence import PLACEHOLDER, Sequence
from nanovllm.outputs import RequestOutput
from nanovllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def build_config(model: str, kwargs: dict) -> Config:
    valid = Config.field_names()
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise TypeError(f"unknown LLM argument(s) {unknown}; valid ones are {valid}")
    return Config(model, **kwargs)


def load_tokenizer(model_dir: str, trust_remote_code: bool = False):
    """The checkpoint's tokenizer, or None for a bare config (dummy weights): prompts are then token ids."""
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any(os.path.exists(os.path.join(model_dir, n)) for n in names):
        logger.warning("%s has no tokenizer: prompts must be token ids and outputs carry no text", model_dir)
        return None
    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)


def step_stats() -> dict[str, float]:
    """Counters per step kind (prefill, mixed, decode): steps, tokens, seconds in step(), and launch_s, the
    host time spent enqueuing overlapped steps (an eager step's Python launches included; near the kind's
    seconds means the host sets those steps' pace). gpu_wait_s: host time blocked on an overlapped step's
    results; near 0 means the host, not the GPU, sets the decode pace."""
    return {f"{kind}_{what}": 0 for kind in ("prefill", "mixed", "decode")
            for what in ("steps", "tokens", "s", "launch_s")} | {"gpu_wait_s": 0.0}


class LLMEngine:
    """Owns the tokenizer, the scheduler and the model runner."""

    def __init__(self, model: str, **kwargs):
        self.config = config = build_config(model, kwargs)
        logger.info("nanovllm engine: model=%s dtype=%s max_model_len=%d max_num_seqs=%d "
                    "max_num_batched_tokens=%d kv_cache_dtype=%s tensor_parallel_size=%d enforce_eager=%s "
                    "enable_prefix_caching=%s device=%s", config.model, config.dtype, config.max_model_len,
                    config.max_num_seqs, config.max_num_batched_tokens, config.kv_cache_dtype,
                    config.tensor_parallel_size, config.enforce_eager, config.enable_prefix_caching, config.device)
        self.tokenizer = load_tokenizer(config.tokenizer or config.model, config.trust_remote_code)
        eos = set(config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        Sequence.block_size = config.kvcache_block_size
        self.model_runner = ModelRunner(config)
        self.scheduler = Scheduler(config, self.model_runner.num_kvcache_blocks)
        self.pending = None   # the step in flight, whose tokens the host has not read
        self.stats = step_stats()

    def shutdown(self) -> None:
        """End tensor-parallel workers and the process group (also done by `del llm` and at exit); the
        engine takes no request after it."""
        self.closed = True
        runner = getattr(self, "model_runner", None)
        if runner is not None:
            runner.shutdown()

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache, e.g. between benchmark runs of the same prompts; False while requests run."""
        return self.scheduler.block_manager.reset_prefix_cache()

    def __del__(self):
        self.shutdown()

    # ---- requests -------------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a text prompt, or the prompt itself given as ids (any integer type, numpy's too);
        ValueError for anything else."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model directory has no tokenizer; give prompts as token-id lists")
            try:
                return self.tokenizer.encode(prompt)
            except Exception as e:      # e.g. a lone surrogate the tokenizer cannot encode
                raise ValueError(f"the prompt could not be tokenized: {type(e).__name__}: {e}") from None
        if not isinstance(prompt, (list, tuple)) and not hasattr(prompt, "tolist"):
            raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
        try:
            return [operator.index(t) for t in ids]
        except TypeError:
            bad = next(t for t in ids if not hasattr(t, "__index__"))
            raise ValueError(f"token ids must be integers, got {bad!r} ({type(bad).__name__})") from None

    def validate(self, token_ids: list[int]) -> None:
        vocab, max_len = self.config.hf_config.vocab_size, self.config.max_model_len
        if not token_ids:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id(s) {bad[:5]} are outside the vocabulary [0, {vocab})")
        if len(token_ids) >= max_len:
            raise ValueError(f"the prompt has {len(token_ids)} tokens; max_model_len={max_len} leaves room "
                             f"for at most {max_len - 1}")

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams) -> Sequence:
        """Raises ValueError for a bad prompt before anything is queued."""
        if sampling_params.n != 1:
            raise ValueError(f"add_request queues one sequence (n=1), got n={sampling_params.n}; generate "
                             f"runs n > 1")
        return self._add_request_n(prompt, sampling_params)[0]

    def _add_sequence(self, token_ids: list[int], sampling_params: SamplingParams) -> Sequence:
        seq = Sequence(token_ids, sampling_params)
        if sampling_params.min_tokens:
            seq.min_tokens_banned = sorted(set(sampling_params.stop_token_ids) |
                                           (set() if sampling_params.ignore_eos else self.eos_token_ids))
        if sampling_params.bad_words:
            seq.bad_words_ids = self.bad_words_ids(sampling_params.bad_words)
        self.scheduler.add(seq)
        return seq

    def bad_words_ids(self, words: list[str]) -> list[list[int]]:
        """Each bad word as token ids, alone and after a space (as vLLM tokenizes them)."""
        if self.tokenizer is None:
            raise ValueError("bad_words needs a tokenizer; this model directory has none")
        found = []
        for word in words:
            for text in (word, " " + word.lstrip()):
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if ids and ids not in found:
                    found.append(ids)
        return found

    # ---- steps ----------------------------------------------------------------------------------
    def step(self) -> tuple[list[Sequence], int, str]:
        """One scheduled batch: returns (finished sequences, tokens computed, the step's kind: 'decode',
        'prefill' or 'mixed').

        With CUDA graphs on, steps overlap with the host: step N is launched before step N-1's tokens are
        read, so the host's bookkeeping for N-1 runs while the GPU computes N. Step N's sequences carry a
        PLACEHOLDER last token until then; its value reaches the GPU directly. This holds for steps too large
        for a graph (run eagerly) as well; a step whose logits processors need the tokens, that verifies
        drafts or computes prompt logprobs waits for the step in flight first (model_runner.can_launch_async)."""
        # drafts are proposed from a sequence's tokens, so a speculative step waits for the step in flight
        finished = self._drain() if self.scheduler.wants_drafts() else []
        batch = self.scheduler.schedule()
        if not batch.seqs:
            if self.pending is None and not finished:
                raise RuntimeError("no sequence fits in the KV cache; raise num_kvcache_blocks or lower "
                                   "max_model_len")
            return finished + self._drain(), 0, "decode"
        if self.model_runner.can_launch_async(batch):
            start = time.perf_counter()
            launched = self.model_runner.launch(batch, self.pending)
            self.stats[f"{batch.kind}_launch_s"] += time.perf_counter() - start
            finished += self._drain()
            sampled = set(batch.sample_rows)
            self.scheduler.postprocess(batch, [PLACEHOLDER if i in sampled else None
                                               for i in range(len(batch.seqs))])
            self.pending = launched
        else:
            finished += self._drain()
            token_ids, logprobs = self.model_runner.run(batch)
            sampled = self.scheduler.postprocess(batch, token_ids)
            self._attach_logprobs(batch.seqs, logprobs)
            num_new = {id(seq): len(t) for seq, t in zip(batch.seqs, token_ids) if isinstance(t, list)} \
                if batch.num_drafted else {}
            finished += [seq for seq in sampled if self._check_stop(seq, num_new.get(id(seq), 1))]
        return finished, batch.num_tokens, batch.kind

    def _drain(self) -> list[Sequence]:
        """Read the in-flight step's tokens into their placeholders and apply the stop checks."""
        if self.pending is None:
            return []
        pending, self.pending = self.pending, None
        start = time.perf_counter()
        token_ids, logprobs = pending.collect()
        self.stats["gpu_wait_s"] += time.perf_counter() - start
        seqs = pending.batch.seqs
        live = [row for row in pending.batch.sample_rows if not seqs[row].is_finished]
        for row in live:
            assert seqs[row].token_ids[-1] == PLACEHOLDER
            seqs[row].token_ids[-1] = token_ids[row]
        if logprobs.sampled:
            logprobs.sampled = {row: d for row, d in logprobs.sampled.items() if not seqs[row].is_finished}
            self._attach_logprobs(seqs, logprobs)
        return [seqs[row] for row in live if self._check_stop(seqs[row])]

    @staticmethod
    def _attach_logprobs(seqs: list[Sequence], logprobs) -> None:
        for row, entry in logprobs.sampled.items():
            seqs[row].logprobs.append(entry)
        for row, (position, entries) in logprobs.prompt.items():
            seqs[row].prompt_logprobs[position:position + len(entries)] = entries

    def _check_stop(self, seq: Sequence, num_new: int = 1) -> bool:
        """Called once per step that gave seq new tokens (their values known): timing, then the stop
        conditions after each new token in turn; tokens after a stop (accepted drafts) are dropped."""
        if seq.first_token_time is None:
            seq.first_token_time = time.perf_counter()
        later = seq.token_ids[len(seq) - num_new + 1:] if num_new > 1 else []
        if later:
            del seq.token_ids[len(seq) - len(later):]
        reason = self.stop_reason(seq)
        while not reason and later:
            seq.token_ids.append(later.pop(0))
            reason = self.stop_reason(seq)
        if reason:
            seq.finish_time = time.perf_counter()
            self.scheduler.finish(seq, reason)
        return bool(reason)

    def stop_reason(self, seq: Sequence) -> str | None:
        params, last = seq.sampling_params, seq.token_ids[-1]
        if not params.ignore_eos and last in self.eos_token_ids:
            return "stop"
        if last in params.stop_token_ids:
            return "stop"
        if params.stop and self._find_stop_string(seq):
            return "stop"
        length = len(seq.token_ids)
        if length - seq.num_prompt_tokens >= params.max_tokens or length >= self.config.max_model_len:
            return "length"
        return None

    def _find_stop_string(self, seq: Sequence) -> bool:
        text = self.detokenize(seq.completion_token_ids, seq.sampling_params.skip_special_tokens)
        hits = [i for i in (text.find(s) for s in seq.sampling_params.stop) if i >= 0]
        if hits:
            seq.text = text[:min(hits)]
        return bool(hits)

    def get_tokenizer(self):
        """The model's tokenizer (None for a bare config with dummy weights), as vLLM's LLM.get_tokenizer."""
        return self.tokenizer

    def detokenize(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def output(self, seq: Sequence) -> dict:
        text, params = getattr(seq, "text", None), seq.sampling_params
        if text is None:
            text = self.detokenize(seq.completion_token_ids, params.skip_special_tokens) if params.detokenize else ""
        out = {"text": text,
               "token_ids": seq.completion_token_ids, "prompt_token_ids": seq.prompt_token_ids,
               "finish_reason": seq.finish_reason, "num_cached_tokens": seq.num_cached_tokens,
               "logprobs": None, "prompt_logprobs": None,
               "metrics": {"arrival_time": seq.arrival_time, "first_token_time": seq.first_token_time,
                           "finish_time": seq.finish_time}}
        if self.config.speculative_config is not None:
            out["metrics"].update(num_draft_tokens=seq.num_draft_tokens,
                                  num_accepted_tokens=seq.num_accepted_tokens)
        if params.logprobs is not None:
            out["logprobs"] = seq.logprobs
            out["cumulative_logprob"] = sum(d[t] for d, t in zip(seq.logprobs, seq.completion_token_ids))
        if params.prompt_logprobs is not None:
            out["prompt_logprobs"] = seq.prompt_logprobs
        return out

    # ---- the loop -------------------------------------------------------------------------------
    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Outputs in input order, as vLLM's RequestOutput (also nanovllm's dict: out["text"], ...).
        Prompts as vLLM takes them: a string, a list of token ids, {"prompt": str} or
        {"prompt_token_ids": [...]}, or a list of these. A bad request gets {'error': ...,
        'finish_reason': 'error'} and the others still run. The call is transactional: wrong arguments
        raise before anything is queued, and any exception during the run (KeyboardInterrupt included)
        aborts this call's requests, frees their blocks and leaves the engine as before the call, then
        propagates."""
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        sampling_params = self._params_per_prompt(sampling_params, len(prompts))
        requests = ((i, prompt, params) for i, (prompt, params) in enumerate(zip(prompts, sampling_params)))
        outputs = dict(stream_outputs(self, requests, use_tqdm, total=len(prompts)))
        return [outputs[i] for i in range(len(prompts))]

    def iter_outputs(self, requests, use_tqdm: bool = False, total: int | None = None,
                     max_waiting: int | None = None):
        """(key, RequestOutput) as each request finishes, for an iterable of (key, prompt, SamplingParams)
        read lazily: requests are queued while fewer than max_waiting sequences wait (default: twice
        max_num_seqs), so a file of millions of lines never sits in memory. A bad request comes back at once
        with finish_reason "error". Breaking out of the loop, or any exception, aborts the requests still
        running (engine/request_stream.py)."""
        yield from stream_outputs(self, requests, use_tqdm, total, max_waiting or 2 * self.config.max_num_seqs)

    def _add_request_n(self, prompt, params: SamplingParams) -> list[Sequence]:
        """The n sequences of one request (vLLM's parallel sampling): the same prompt, each its own
        completion; with a seed, completion j draws from seed + j. Prefix caching lets them share the
        prompt's full blocks."""
        if getattr(self, "closed", False):
            raise RuntimeError("this engine was shut down (shutdown() ended its workers); create a new LLM")
        token_ids = self.tokenize(prompt)
        self.validate(token_ids)
        if params.n == 1:
            return [self._add_sequence(token_ids, params)]
        seeds = [None if params.seed is None else (params.seed + j) % 2**64 for j in range(params.n)]
        return [self._add_sequence(token_ids, dataclasses.replace(params, n=1, seed=seed)) for seed in seeds]

    @staticmethod
    def _params_per_prompt(sampling_params, num_prompts: int) -> list[SamplingParams]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * num_prompts
        if not isinstance(sampling_params, (list, tuple)):
            raise TypeError(f"sampling_params must be a SamplingParams, a list of them (one per prompt) or None, "
                            f"got {type(sampling_params).__name__}")
        if len(sampling_params) != num_prompts:
            raise ValueError(f"got {len(sampling_params)} SamplingParams for {num_prompts} prompts; "
                             f"give one, or one per prompt")
        bad = [i for i, p in enumerate(sampling_params) if not isinstance(p, SamplingParams)]
        if bad:
            raise TypeError(f"sampling_params[{bad[0]}] is a {type(sampling_params[bad[0]]).__name__}, "
                            f"not a SamplingParams")
        return list(sampling_params)

    def abort(self, seqs: list[Sequence]) -> None:
        """Stop these requests (finish_reason 'abort') and free their blocks; the step in flight, if any,
        is waited for first, so no later step reads a freed block's placeholder."""
        try:
            self._drain()
        except Exception:   # the step itself failed: its results are lost with the aborted requests
            self.pending = None
        self.scheduler.abort(seqs)
