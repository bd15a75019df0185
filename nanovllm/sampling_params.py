"""Per-request sampling settings, validated on construction (vLLM's names and meanings)."""
from dataclasses import dataclass, field


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
        self.stop_token_ids = list(self.stop_token_ids)
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not isinstance(k, int) or not 0 <= k <= 20):
                raise ValueError(f"{name} must be None or an integer in [0, 20], got {k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not -2**63 <= self.seed < 2**64):
            raise ValueError(f"seed must be None or an integer in [-2**63, 2**64), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
