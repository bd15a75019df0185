"""What generate returns, shaped as vLLM's: `RequestOutput` with `.prompt`, `.prompt_token_ids` and
`.outputs[0].text / .token_ids / .finish_reason / .logprobs / .cumulative_logprob`, `.finished`,
`.metrics`. A RequestOutput is also the dict that nanovllm returned before (`out["text"]`,
`out["token_ids"]`, `out["finish_reason"]`, ...), so scripts written either way keep working."""
from dataclasses import dataclass


@dataclass
class CompletionOutput:
    """One completion of a request (vLLM's fields)."""
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput(dict):
    """A finished request: vLLM's attributes over nanovllm's dict keys."""

    def __init__(self, completions: dict | list[dict], request_id: str, prompt: str | None):
        """completions: the fields of each completion (n of them), or one dict (a rejected request). The
        dict keys are the first completion's."""
        completions = [completions] if isinstance(completions, dict) else completions
        super().__init__(completions[0])
        self.request_id = request_id
        self.prompt = prompt
        self.outputs = [CompletionOutput(j, c["text"], c["token_ids"], c.get("cumulative_logprob"), c.get("logprobs"),
                                         c["finish_reason"]) for j, c in enumerate(completions)]

    prompt_token_ids = property(lambda self: self["prompt_token_ids"])
    prompt_logprobs = property(lambda self: self.get("prompt_logprobs"))
    num_cached_tokens = property(lambda self: self.get("num_cached_tokens", 0))
    metrics = property(lambda self: self.get("metrics"))
    error = property(lambda self: self.get("error"))
    finished = property(lambda self: True)

    def __repr__(self) -> str:
        return (f"RequestOutput(request_id={self.request_id!r}, prompt={self.prompt!r}, "
                f"prompt_token_ids={self.prompt_token_ids!r}, outputs={self.outputs!r})")
