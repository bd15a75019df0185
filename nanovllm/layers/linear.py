"""Tensor-parallel linear layers; the arithmetic is delegated to a per-layer quant method.

Column-parallel layers split the output features across ranks, row-parallel ones the input features
(their partial sums are all-reduced). QKV and gate/up are column-parallel layers packing several
checkpoint tensors, loaded one shard at a time. A parameter says which of its dims holds the output
(`output_dim`) and input (`input_dim`) features, so any quant method's tensors shard the same way.
"""
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.utils.distributed import all_reduce, get_tp_rank, get_tp_size


@runtime_checkable
class LinearMethod(Protocol):
    """How a linear layer holds and applies its weight (unquantized, AWQ, ...). Parameters carry
    `output_dim` / `input_dim` (and `divisors` for packed dims) so that the layers shard any method's
    tensors the same way."""

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        """Register the layer's parameters for this rank's [input_size, output_size] slice."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn the checkpoint's tensors into the kernels' layout (once, after loading)."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """y = x W (+ bias) for x [..., input_size]."""

    def apply_silu_and_mul(self, layer: nn.Module, gate_up: torch.Tensor,
                           bias: torch.Tensor | None) -> torch.Tensor | None:
        """The layer applied to silu(gate) * up of gate_up, if a kernel fuses the activation; else None."""


class UnquantizedLinearMethod:
    """y = x W^T (+ b) with a full-precision weight [out, in]."""

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int) -> None:
        weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        weight.output_dim, weight.input_dim = 0, 1
        layer.register_parameter("weight", weight)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        pass     # the checkpoint's layout is the kernel's

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)

    def apply_silu_and_mul(self, layer: nn.Module, gate_up: torch.Tensor, bias: torch.Tensor | None) -> None:
        """No kernel here takes SwiGLU's activation into its matmul: the MLP applies it first."""
        return None


class LinearBase(nn.Module):
    """Shapes of this rank's shard, parameters from the quant method, and loading."""

    def __init__(self, input_size: int, output_size: int, bias: bool, quant_method: LinearMethod | None = None):
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.input_size, self.output_size = input_size, output_size   # this rank's shard
        self.quant_method = quant_method or UnquantizedLinearMethod()
        self.quant_method.create_weights(self, input_size, output_size)
        for param in self.parameters(recurse=False):
            param.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.output_dim = 0
            self.bias.weight_loader = self.weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)

    @staticmethod
    def _slice(param: nn.Parameter, tensor: torch.Tensor, dim_attr: str, start: int, size: int):
        """Features [start, start + size) along param's `dim_attr` dim, in stored units: a quant method
        may pack or group features, which it states as `param.divisors = {dim_attr: n}`."""
        dim = getattr(param, dim_attr, None)
        if dim is None:
            return tensor
        n = getattr(param, "divisors", {}).get(dim_attr, 1)
        return tensor.narrow(dim, start // n, size // n)

    @staticmethod
    def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
        if dst.shape != src.shape:
            raise ValueError(f"checkpoint tensor {name} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
        dst.copy_(src)

    def shard_of(self, param: nn.Parameter, loaded: torch.Tensor, dim_attr: str, rank: int, size: int,
                 num_shards: int, name: str) -> torch.Tensor:
        """`rank`'s slice of a full checkpoint tensor made of `num_shards` slices of `size` features."""
        dim = getattr(param, dim_attr, None)
        n = getattr(param, "divisors", {}).get(dim_attr, 1)
        if dim is not None and loaded.shape[dim] != size // n * num_shards:
            raise ValueError(f"checkpoint tensor {name} has shape {tuple(loaded.shape)}: dim {dim} should be "
                             f"{size // n * num_shards}")
        return self._slice(param, loaded, dim_attr, rank * size, size)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, quant_method=None):
        assert output_size % get_tp_size() == 0
        super().__init__(input_size, output_size // get_tp_size(), bias, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, name: str = "") -> None:
        shard = self.shard_of(param, loaded, "output_dim", self.tp_rank, self.output_size, self.tp_size, name)
        self._copy(param.data, shard, name)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate and up); shard_id is their index."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False, quant_method=None):
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, name: str = "",
                      shard_id: int = 0) -> None:
        tp = self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // tp
        size = self.output_sizes[shard_id] // tp
        dst = self._slice(param, param.data, "output_dim", offset, size)
        self._copy(dst, self.shard_of(param, loaded, "output_dim", self.tp_rank, size, tp, name), name)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; KV heads are replicated when ranks outnumber them."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int,
                 bias: bool = False, quant_method=None):
        tp = get_tp_size()
        self.head_size = head_size
        self.num_heads = total_num_heads // tp
        self.num_kv_heads = max(1, total_num_kv_heads // tp)
        self.kv_replicas = max(1, tp // total_num_kv_heads)
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp
        super().__init__(hidden_size, output_size, bias, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, name: str = "",
                      shard_id: str = "q") -> None:
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[shard_id]
        rank, num_shards = self.tp_rank, self.tp_size
        if shard_id != "q":
            rank, num_shards = rank // self.kv_replicas, num_shards // self.kv_replicas
        dst = self._slice(param, param.data, "output_dim", offset, size)
        self._copy(dst, self.shard_of(param, loaded, "output_dim", rank, size, num_shards, name), name)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs summed by all-reduce."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, quant_method=None):
        assert input_size % get_tp_size() == 0
        super().__init__(input_size // get_tp_size(), output_size, bias, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, name: str = "") -> None:
        shard = self.shard_of(param, loaded, "input_dim", self.tp_rank, self.input_size, self.tp_size, name)
        self._copy(param.data, shard, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.tp_rank == 0 else None
        return all_reduce(self.quant_method.apply(self, x, bias))

    def forward_silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor | None:
        """self(silu(gate) * up) of gate_up = [gate | up] when the quantization method takes the activation
        into its matmul (AWQ's one-token GEMV); None when it does not."""
        y = self.quant_method.apply_silu_and_mul(self, gate_up, self.bias if self.tp_rank == 0 else None)
        return None if y is None else all_reduce(y)
