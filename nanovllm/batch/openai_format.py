"""The OpenAI Batch file format, as vLLM's run_batch reads and writes it.

An input line: {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions" or "/v1/completions",
"body": {...}}, the body as OpenAI and vLLM name its fields ("messages" or "prompt", "max_tokens" /
"max_completion_tokens", "temperature", "top_p", "stop", "logprobs", ..., plus vLLM's extra sampling
fields). An output line: {"id", "custom_id", "response": {"status_code": 200, "request_id", "body": a
chat.completion or text_completion object with choices and usage}, "error": null}; a request that cannot
run gets "response": null and "error": {"code", "message"}; a line without a usable custom_id is named
"line-N" (its line number, from 1), so that a resumed run recognises its error line too.
"""
import json
import time
import uuid
from dataclasses import dataclass

from nanovllm.sampling_params import SamplingParams

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
# body fields that go to SamplingParams under the same name
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "ignore_eos",
                   "stop_token_ids", "skip_special_tokens", "bad_words")
# fields an OpenAI client sends that change nothing offline
IGNORED_FIELDS = ("model", "user", "stream_options", "metadata", "store", "service_tier")


class BadRequest(ValueError):
    """A line that cannot run; custom_id is known when the line was JSON with one."""

    def __init__(self, message: str, custom_id: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.custom_id, self.code = custom_id, code


@dataclass
class BatchRequest:
    custom_id: str
    url: str
    prompt: str | list[int]
    params: SamplingParams
    top_logprobs: int | None          # logprobs asked for (chat: top_logprobs with logprobs=true)


def parse_line(line: str, tokenizer, max_model_len: int) -> BatchRequest:
    """One input line -> a request; BadRequest naming what is wrong and what is allowed."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRequest(f"the line is not valid JSON: {e}") from None
    if not isinstance(record, dict):
        raise BadRequest("a line must be a JSON object with custom_id, method, url and body")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise BadRequest("custom_id must be a non-empty string")
    try:
        return _parse_record(record, custom_id, tokenizer, max_model_len)
    except BadRequest as e:
        e.custom_id = custom_id
        raise
    except (ValueError, TypeError) as e:   # SamplingParams' own checks
        raise BadRequest(str(e), custom_id) from None


def _parse_record(record: dict, custom_id: str, tokenizer, max_model_len: int) -> BatchRequest:
    url, body = record.get("url"), record.get("body")
    if url not in (CHAT, COMPLETIONS):
        raise BadRequest(f"url {url!r} is not served; use {CHAT!r} or {COMPLETIONS!r}", code="unknown_url")
    if record.get("method", "POST") != "POST":
        raise BadRequest(f"method must be POST, got {record.get('method')!r}")
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    prompt_field = "messages" if url == CHAT else "prompt"
    known = {prompt_field, "max_tokens", "logprobs", *SAMPLING_FIELDS, *IGNORED_FIELDS, "stream"}
    known |= {"max_completion_tokens", "top_logprobs", "chat_template_kwargs"} if url == CHAT else set()
    unknown = sorted(set(body) - known)
    if unknown:
        raise BadRequest(f"unknown body field(s) {unknown} for {url}; allowed: {sorted(known)}")
    if body.get("stream"):
        raise BadRequest("stream=true is not offered in a batch file")
    if prompt_field not in body:
        raise BadRequest(f"body needs {prompt_field!r}")
    prompt = chat_prompt(body, tokenizer) if url == CHAT else completion_prompt(body["prompt"])
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:     # OpenAI: chat runs to the context's end, completions stop at 16
        max_tokens = max_model_len if url == CHAT else 16
    top_logprobs = logprobs_asked(body, url)
    kwargs = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    params = SamplingParams(max_tokens=max_tokens, logprobs=top_logprobs, **kwargs)
    return BatchRequest(custom_id, url, prompt, params, top_logprobs)


def chat_prompt(body: dict, tokenizer) -> str:
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {'role', 'content'}")
    if tokenizer is None:
        raise BadRequest("this model has no tokenizer, so no chat template; use /v1/completions with token ids")
    plain = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise BadRequest(f"a message is {{'role', 'content'}}, got {m!r}")
        content = m.get("content")
        if isinstance(content, list):      # content parts: only text parts are served
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise BadRequest("only text content parts ({'type': 'text', 'text': ...}) are served")
            content = "".join(p.get("text", "") for p in content)
        plain.append({**m, "content": content if content is not None else ""})
    kwargs = body.get("chat_template_kwargs") or {}
    return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True, **kwargs)


def completion_prompt(prompt) -> str | list[int]:
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
        return prompt
    raise BadRequest("prompt must be a string or a list of token ids (one prompt per line)")


def logprobs_asked(body: dict, url: str) -> int | None:
    if url == CHAT:
        if not body.get("logprobs"):
            return None
        return int(body.get("top_logprobs") or 0)
    value = body.get("logprobs")
    return None if value is None else int(value)


def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id]) if tokenizer is not None else str(token_id)


def choice_logprobs(completion, request: BatchRequest, tokenizer) -> dict | None:
    """OpenAI's logprobs object of one choice, from nanovllm's per-token dicts (the sampled token and the
    k most likely, k = top_logprobs)."""
    if completion.logprobs is None:
        return None
    k = request.top_logprobs or 0
    sampled = list(zip(completion.token_ids, completion.logprobs))
    tops = [sorted(entry.items(), key=lambda kv: -kv[1])[:k] for _, entry in sampled]
    if request.url == CHAT:
        def item(token_id, logprob):
            text = _token_text(tokenizer, token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
        return {"content": [{**item(t, entry[t]), "top_logprobs": [item(u, lp) for u, lp in top]}
                            for (t, entry), top in zip(sampled, tops)]}
    texts = [_token_text(tokenizer, t) for t, _ in sampled]
    offsets, at = [], 0
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {"tokens": texts, "token_logprobs": [entry[t] for t, entry in sampled],
            "top_logprobs": [{_token_text(tokenizer, u): lp for u, lp in top} for top in tops],
            "text_offset": offsets}


def response_line(request: BatchRequest, output, model: str, tokenizer) -> dict:
    """The output line of a request that ran."""
    choices = []
    for c in output.outputs:
        choice = {"index": c.index, "finish_reason": c.finish_reason,
                  "logprobs": choice_logprobs(c, request, tokenizer)}
        if request.url == CHAT:
            choice["message"] = {"role": "assistant", "content": c.text}
        else:
            choice["text"] = c.text
        choices.append(choice)
    prompt_tokens = len(output.prompt_token_ids)
    completion_tokens = sum(len(c.token_ids) for c in output.outputs)
    body = {"id": f"{'chatcmpl' if request.url == CHAT else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if request.url == CHAT else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": request.custom_id,
            "response": {"status_code": 200, "request_id": f"nanovllm-{uuid.uuid4().hex}", "body": body},
            "error": None}


def result_line(request: BatchRequest, output, model: str, tokenizer) -> dict:
    """The output line of a request the engine took: its response, or its error (e.g. a prompt too long)."""
    if output.get("error"):
        return error_line(request.custom_id, output["error"])
    return response_line(request, output, model, tokenizer)


def error_line(custom_id: str | None, message: str, code: str = "invalid_request") -> dict:
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}
