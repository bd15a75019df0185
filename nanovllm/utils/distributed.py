"""Tensor-parallel rank, world size and collectives; a single process is rank 0 of 1."""
import torch
import torch.distributed as dist


def get_tp_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def get_tp_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if get_tp_size() > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's shard along the last dimension."""
    if get_tp_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(get_tp_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)
