"""One request: its tokens, sampling settings, KV block table and progress counters."""
import time
from copy import copy
from enum import Enum, auto
from itertools import count

from nanovllm.sampling_params import SamplingParams

PLACEHOLDER = -1   # a token sampled on the GPU whose value the host has not read yet (overlapped decode)


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """Token ids (prompt then output), the blocks that hold their KV, and how many are computed."""
    block_size = 256
    counter = count()

    def __init__(self, token_ids: list[int], sampling_params: SamplingParams = SamplingParams()):
        self.seq_id = next(Sequence.counter)
        self.status = SequenceStatus.WAITING
        self.token_ids = copy(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_cached_tokens = 0     # prompt tokens found in the prefix cache
        self.num_computed_tokens = 0   # tokens whose K/V are in the cache
        self.block_table: list[int] = []
        self.sampling_params = sampling_params
        self.processes_logits = sampling_params.processes_logits   # read at every step: decided once
        self.finish_reason: str | None = None
        self.generator = None          # per-request torch.Generator when a seed is given
        self.arrival_time = time.perf_counter()
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.logprobs: list[dict[int, float]] = []            # one per generated token, when asked
        self.prompt_logprobs: list[dict[int, float] | None] = [None] * len(token_ids)
        self.min_tokens_banned: list[int] = []      # EOS and stop ids, banned until min_tokens are out
        self.bad_words_ids: list[list[int]] = []    # bad_words as token ids (engine/logits_processors.py)
        self.num_drafts = 0            # draft tokens at the end of token_ids during a speculative step
        self.num_draft_tokens = 0      # drafts proposed for this request so far (speculative decoding)
        self.num_accepted_tokens = 0   # of those, the ones the model kept

    def __getstate__(self) -> dict:
        """What a tensor-parallel worker needs: no generator, no logprobs collected on rank 0."""
        state = dict(self.__dict__)
        state.update(generator=None, logprobs=[], prompt_logprobs=[])
        return state

    def __len__(self) -> int:
        return len(self.token_ids)

    def __getitem__(self, key):
        return self.token_ids[key]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def will_finish(self) -> bool:
        """Its last token, still in flight, is its last by max_tokens: no further step needed."""
        return len(self.token_ids) - self.num_prompt_tokens >= self.sampling_params.max_tokens

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_blocks(self) -> int:
        return -(-len(self.token_ids) // self.block_size)

    def block(self, i: int) -> list[int]:
        assert 0 <= i < self.num_blocks
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def add_drafts(self, draft_ids: list[int]) -> None:
        """Guesses for the next tokens, computed by this step and kept only as far as the model agrees."""
        self.token_ids += draft_ids
        self.num_drafts = len(draft_ids)
        self.num_draft_tokens += len(draft_ids)

    def drop_drafts(self) -> list[int]:
        """Remove this step's drafts from token_ids and return them."""
        if not self.num_drafts:
            return []
        drafts = self.token_ids[-self.num_drafts:]
        del self.token_ids[-self.num_drafts:]
        self.num_drafts = 0
        return drafts
