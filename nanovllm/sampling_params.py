"""Per-request sampling settings, validated on construction (vLLM's names and meanings).

Logits pass through, in order (as vLLM V1's sampler): min_tokens (EOS and stop tokens banned until that
many tokens are out), logit_bias (added), bad_words (banned where the tokens before them match), the
penalties (repetition over prompt and output, as transformers' RepetitionPenaltyLogitsProcessor;
presence and frequency over the output), then temperature, top-k, top-p, min-p. Logprobs report the model's
own distribution (vLLM's default "raw_logprobs").
"""
from dataclasses import dataclass, field, fields


@dataclass
class SamplingParams:
    """How one request samples and when it stops."""
    temperature: float = 1.0       # 0 means greedy
    top_k: int = -1                # -1 (or 0): all tokens
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] | str | None = None
    seed: int | None = None
    logprobs: int | None = None          # per generated token: its logprob and the top-k alternatives
    prompt_logprobs: int | None = None   # the same for every prompt token after the first
    n: int = 1                           # completions per prompt (they share the prompt's cached blocks)
    presence_penalty: float = 0.0        # subtracted once from every token already in the output
    frequency_penalty: float = 0.0       # subtracted per occurrence in the output
    repetition_penalty: float = 1.0      # > 1 discourages tokens in the prompt or output (logit / p if > 0)
    logit_bias: dict[int, float] | None = None   # token id -> added to its logit (clamped to [-100, 100])
    bad_words: list[str] | None = None   # words never generated (each as its tokens, with and without a space)
    min_tokens: int = 0                  # EOS and stop_token_ids are banned until this many tokens are out
    skip_special_tokens: bool = True
    detokenize: bool = True              # False: outputs carry token ids only (text "")

    def __post_init__(self):
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if self.top_k == 0:
            self.top_k = -1
        if not (self.top_k == -1 or self.top_k >= 1):
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings are matched in the detokenized text: they need detokenize=True")
        self.stop_token_ids = list(self.stop_token_ids)
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not isinstance(k, int) or not 0 <= k <= 20):
                raise ValueError(f"{name} must be None or an integer in [0, 20], got {k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not -2**63 <= self.seed < 2**64):
            raise ValueError(f"seed must be None or an integer in [-2**63, 2**64), got {self.seed!r}")
        self._check_processors()

    def _check_processors(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        if self.logit_bias is not None:
            try:   # JSON object keys arrive as strings, as in OpenAI requests
                self.logit_bias = {int(k): min(max(float(v), -100.0), 100.0) for k, v in self.logit_bias.items()}
            except (AttributeError, TypeError, ValueError):
                raise ValueError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}") from None
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        if self.bad_words is not None and any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
            raise ValueError(f"bad_words must be a list of non-empty strings, got {self.bad_words!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], "
                             f"got {self.min_tokens!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processes_logits(self) -> bool:
        """Whether sampling needs this request's tokens so far (penalties, bad words, min_tokens) or a bias."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.bad_words or self.min_tokens)


FIELD_NAMES = [f.name for f in fields(SamplingParams)]
_dataclass_init = SamplingParams.__init__


def _init(self, *args, **kwargs):
    unknown = sorted(set(kwargs) - set(FIELD_NAMES))
    if unknown:
        raise TypeError(f"unknown SamplingParams argument(s) {unknown}; valid ones are {FIELD_NAMES}")
    _dataclass_init(self, *args, **kwargs)


SamplingParams.__init__ = _init
