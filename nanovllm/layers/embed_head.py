"""Vocabulary-parallel embedding and LM head: each rank holds a contiguous slice of the vocabulary."""
import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.utils.distributed import (
    all_gather_last_dim,
    all_reduce,
    get_tp_rank,
    get_tp_size,
)


class VocabParallelEmbedding(nn.Module):
    """Token embeddings; rows outside this rank's slice contribute zeros to the all-reduce."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.num_embeddings = num_embeddings
        self.shard_size = (num_embeddings + self.tp_size - 1) // self.tp_size
        self.vocab_start = self.shard_size * self.tp_rank
        self.weight = nn.Parameter(torch.empty(self.shard_size, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, name: str = "") -> None:
        shard = loaded[self.vocab_start:self.vocab_start + self.shard_size]
        if loaded.shape[1:] != param.shape[1:] or loaded.shape[0] != self.num_embeddings:
            raise ValueError(f"checkpoint tensor {name} has shape {tuple(loaded.shape)}, expected "
                             f"({self.num_embeddings}, {param.shape[1]})")
        param.data.zero_()
        param.data[:shard.shape[0]].copy_(shard)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.shard_size)
        y = F.embedding(local.clamp(0, self.shard_size - 1), self.weight) * mine.unsqueeze(-1)
        return all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits for the given hidden states, gathered over the vocabulary from all ranks."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = all_gather_last_dim(F.linear(hidden_states, self.weight))
        return logits[..., :self.num_embeddings]
