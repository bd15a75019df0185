"""Mixture-of-experts MLP (Qwen3-MoE): a router picks top_k of num_experts SwiGLU experts per token.

For a token x with router logits r = x G^T:
    p = softmax(r) (float32),  (w, e) = top_k(p),  w /= sum(w) when norm_topk_prob,
    y = sum_i w_i * down_{e_i}(silu(gate_{e_i}(x)) * up_{e_i}(x)).
Weights per layer: w13 [num_experts, 2 * intermediate, hidden] (gate rows, then up rows) and
w2 [num_experts, hidden, intermediate], each expert's tensors loaded from the checkpoint's
`experts.<e>.{gate,up,down}_proj.weight`. Under tensor parallelism every rank holds the same slice of every
expert's intermediate dimension (gate/up rows, down columns) and the partial outputs are summed
(all_reduce), as RowParallelLinear does. `fused_moe_ref` is the plain-PyTorch definition: the tokens of
each expert gathered, its MLP applied, the results scattered back weighted. On CUDA, triton_moe.fused_moe
computes the same in two grouped GEMMs over all experts, with no host sync (CUDA graphs can hold it).
"""
import torch
import torch.nn.functional as F
from torch import nn

from nanovllm.utils.distributed import all_reduce, get_tp_rank, get_tp_size


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [num_tokens, num_experts] -> (weights [num_tokens, top_k] float32, expert ids)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def fused_moe_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, hidden] -> [num_tokens, hidden]: each token's experts' SwiGLU outputs, weighted."""
    out = torch.zeros_like(x)
    inter = w2.shape[2]
    weights = topk_weights.to(x.dtype)
    for expert in torch.unique(topk_ids).tolist():
        token, slot = torch.where(topk_ids == expert)                  # the tokens routed to this expert
        gate_up = x[token] @ w13[expert].t()                          # [n, 2 * inter]
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out.index_add_(0, token, (h @ w2[expert].t()) * weights[token, slot, None])
    return out


class FusedMoE(nn.Module):
    """The experts of one layer, all in two stacked tensors; forward takes the router's logits."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, renormalize: bool):
        super().__init__()
        tp = get_tp_size()
        if intermediate_size % tp:
            raise ValueError(f"moe_intermediate_size={intermediate_size} must divide by tensor_parallel_size={tp}")
        self.top_k, self.renormalize, self.tp_rank = top_k, renormalize, get_tp_rank()
        self.inter = intermediate_size // tp
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * self.inter, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, self.inter), requires_grad=False)
        experts = range(num_experts)
        self.w13_weight.shard_ids = [(kind, e) for e in experts for kind in ("gate", "up")]
        self.w2_weight.shard_ids = [("down", e) for e in experts]
        for param in (self.w13_weight, self.w2_weight):
            param.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, name: str, shard_id: tuple[str, int]) -> None:
        """Expert e's gate/up [intermediate, hidden] or down [hidden, intermediate], this rank's slice."""
        kind, expert = shard_id
        lo, hi = self.tp_rank * self.inter, (self.tp_rank + 1) * self.inter
        if kind == "down":
            part, target = loaded[:, lo:hi], param.data[expert]
        else:
            part = loaded[lo:hi]
            start = 0 if kind == "gate" else self.inter
            target = param.data[expert, start:start + self.inter]
        if part.shape != target.shape:
            raise ValueError(f"checkpoint tensor {name} has shape {tuple(loaded.shape)}, which does not fit "
                             f"expert {expert}'s {kind} slice {tuple(target.shape)}")
        target.copy_(part)

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from nanovllm.layers.triton_moe import fused_moe, route
            weights, ids = route(router_logits, self.top_k, self.renormalize)
            return all_reduce(fused_moe(x, self.w13_weight, self.w2_weight, weights, ids))
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
        return all_reduce(fused_moe_ref(x, self.w13_weight, self.w2_weight, weights, ids))
