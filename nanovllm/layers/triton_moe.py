"""Fused mixture-of-experts for the GPU: tokens sorted by expert, two grouped GEMMs over all experts.

`fused_moe_ref` (moe.py) loops over experts on the host; here one launch covers every expert:
1. moe_align: the step's (token, slot) pairs, as flat indices p = token * top_k + slot, sorted by expert,
   each expert's run padded to a multiple of BLOCK_M with the index num_pairs (no token). Block b (rows
   b * BLOCK_M ...) then belongs to one expert, block_experts[b] (-1 past the last run). All of it is
   computed on the device with sizes fixed by the worst case (num_pairs + num_experts * (BLOCK_M - 1)
   rows), so the host never waits and a CUDA graph can hold it.
2. gate_up: a program per (block, BLOCK_N columns of the intermediate) multiplies its tokens' rows of x
   by its expert's gate and up rows of w13 and writes silu(gate) * up to h[p] (SiLU-and-multiply fused).
3. down: a program per (block, BLOCK_N columns of hidden) multiplies h[p] by its expert's w2 and writes
   the result times the router weight of p to y[p].
4. out = y.view(num_tokens, top_k, hidden).sum(1).
Each program reads only its own tokens and its own expert's weights; blocks past the runs return at once.

Routing (`select_experts`: float32 softmax, top_k, renormalized) is one launch too, `route`: a program per
token holds its router logits, and picks the top_k by repeated max (ties to the lower expert id).

Decode steps (at most PER_PAIR_MAX_PAIRS pairs, e.g. two tokens of Qwen3-30B-A3B's top 8) skip the sort:
block b holds pair b alone and block_experts is topk_ids itself, so step 1 costs no launch. Sorting took
about 25 small launches per layer, which at batch 1 cost more than reading the experts' weights; a pair
whose expert another pair also picked reads that expert again (rare among 128 experts at 16 pairs).
Steps 3 and 4 are then one launch too (`_down_sum_kernel`): a program per (token, BLOCK_N columns of
hidden) walks the token's top_k experts in turn, a row-times-matrix product each (one row needs no tensor
core), and adds their weighted results in float32, rounded as steps 3 and 4 round them. At batch 1 the
sum was a launch of its own per layer, ~5 us against the down GEMM's ~12 us (H100 profile).
"""
import functools

import torch
import triton
import triton.language as tl

from nanovllm.utils.precision import dot_precision

__all__ = ["fused_moe", "launch_settings", "moe_align", "route"]

PER_PAIR_MAX_PAIRS = 16


@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, stride_l, num_experts, TOP_K: tl.constexpr,
                  BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, RENORMALIZE: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    x = tl.load(logits_ptr + token * stride_l + experts, mask=experts < num_experts, other=float("-inf"))
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = p / tl.sum(p, 0)                                        # softmax; experts past the last are 0
    slots = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_K], tl.float32)
    ids = tl.zeros([BLOCK_K], tl.int32)
    for i in tl.static_range(TOP_K):                            # the largest left, TOP_K times
        best = tl.max(p, 0)
        pick = tl.min(tl.where(p == best, experts, BLOCK_E), 0)     # the lowest id among equals
        pick = tl.minimum(pick, num_experts - 1)   # NaN logits (a CUDA graph's padding row) still name an expert
        weights = tl.where(slots == i, best, weights)
        ids = tl.where(slots == i, pick, ids)
        p = tl.where(experts == pick, -1.0, p)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, 0)                  # slots past TOP_K hold 0
    tl.store(weights_ptr + token * TOP_K + slots, weights, mask=slots < TOP_K)
    tl.store(ids_ptr + token * TOP_K + slots, ids, mask=slots < TOP_K)


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What moe.select_experts computes, in one launch: (weights [num_tokens, top_k] float32, expert ids
    int32), largest first."""
    num_tokens, num_experts = router_logits.shape
    assert router_logits.stride(-1) == 1 and top_k <= num_experts
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=router_logits.device)
    _route_kernel[(num_tokens,)](router_logits, weights, ids, router_logits.stride(0), num_experts, TOP_K=top_k,
                                 BLOCK_E=triton.next_power_of_2(num_experts),
                                 BLOCK_K=triton.next_power_of_2(top_k), RENORMALIZE=renormalize)
    return weights, ids


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids [num_tokens, top_k] -> (sorted pair ids [max_rows] int32, padded with num_pairs;
    block_experts [max_rows / block_m] int32, -1 for blocks past the last expert's run)."""
    flat = topk_ids.flatten().long()
    pairs = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)                      # pair ids grouped by expert
    experts = flat[order]
    rank = torch.arange(pairs, device=flat.device) - (counts.cumsum(0) - counts)[experts]   # place in its run
    max_rows = triton.cdiv(pairs + num_experts * (block_m - 1), block_m) * block_m
    sorted_ids = torch.full((max_rows,), pairs, dtype=torch.int32, device=flat.device)
    sorted_ids[(ends - padded)[experts] + rank] = order.to(torch.int32)
    block_starts = torch.arange(0, max_rows, block_m, device=flat.device)
    block_experts = torch.searchsorted(ends, block_starts, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1).to(torch.int32)
    return sorted_ids, block_experts


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, h_ptr, sorted_ptr, experts_ptr, num_pairs, K, N, stride_x, stride_we, stride_wn,
                    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(experts_ptr + pid_m)
    if expert < 0:
        return
    pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    token = (pair // TOP_K).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(x_ptr + token[:, None] * stride_x + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & col_ok[None, :]
        gate = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None], mask=w_mask, other=0.0)        # [K, N]
        up = tl.load(w_base + (N + cols[None, :]) * stride_wn + ks[:, None], mask=w_mask, other=0.0)
        acc_gate = tl.dot(a, gate, acc_gate, input_precision=DOT_PRECISION)
        acc_up = tl.dot(a, up, acc_up, input_precision=DOT_PRECISION)
    dtype = h_ptr.dtype.element_ty
    gate, up = acc_gate.to(dtype).to(tl.float32), acc_up.to(dtype).to(tl.float32)   # rounded as the reference
    h = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32) * up
    tl.store(h_ptr + pair.to(tl.int64)[:, None] * N + cols[None, :], h.to(dtype), mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, y_ptr, weights_ptr, sorted_ptr, experts_ptr, num_pairs, K, N, stride_we, stride_wn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(experts_ptr + pid_m)
    if expert < 0:
        return
    pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    row = pair.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(h_ptr + row[:, None] * K + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
    dtype = y_ptr.dtype.element_ty
    weight = tl.load(weights_ptr + row, mask=valid, other=0.0).to(dtype).to(tl.float32)
    y = acc.to(dtype).to(tl.float32) * weight[:, None]
    tl.store(y_ptr + row[:, None] * N + cols[None, :], y.to(dtype), mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _down_sum_kernel(h_ptr, w_ptr, out_ptr, weights_ptr, ids_ptr, K, N, stride_we, stride_wn,
                     TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_TILES: tl.constexpr):
    """out[token, cols] = sum over the token's slots of weight * (h[pair] @ w2[expert, cols]^T), each slot's
    product and weighted value rounded to the output dtype as _down_kernel rounds them, summed in float32."""
    token, pid_n = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    dtype = out_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)      # the current slot's product
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)    # the weighted slots so far
    for i in range(TOP_K * K_TILES):                  # one flat loop: loads stay in flight across slots
        slot = i // K_TILES
        pair = token * TOP_K + slot
        ks = (i % K_TILES) * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        h = tl.load(h_ptr + pair * K + ks, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + expert * stride_we + cols[:, None] * stride_wn + ks[None, :],
                    mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * h[None, :], axis=1)
        if i % K_TILES == K_TILES - 1:                # the slot's last tile: weigh it, start the next
            weight = tl.load(weights_ptr + pair).to(dtype).to(tl.float32)
            total += (acc.to(dtype).to(tl.float32) * weight).to(dtype).to(tl.float32)
            acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    tl.store(out_ptr + token * N + cols, total.to(dtype), mask=col_ok)


@functools.cache
def one_pair_per_block(num_pairs: int, block_m: int, device: torch.device) -> torch.Tensor:
    """moe_align's sorted ids when block b holds pair b alone: [num_pairs * block_m] int32 (made once per
    size, before any CUDA graph capture reads it)."""
    ids = torch.full((num_pairs, block_m), num_pairs, dtype=torch.int32, device=device)
    ids[:, 0] = torch.arange(num_pairs, dtype=torch.int32, device=device)
    return ids.flatten()


def _block_m(num_pairs: int, num_experts: int) -> int:
    """Rows per block: small when few pairs reach each expert (decode), larger for prefill."""
    per_expert = num_pairs / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


def launch_settings(block_m: int, per_pair: bool = False) -> dict[str, tuple[int, int, int, int]]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) of each GEMM. A per-pair decode (a block per pair, one
    row each) takes narrower gate_up column tiles, which give the GPU more programs, and down with the sum
    in one launch ("down_sum"; settings with "down" instead run the down GEMM and the sum apart); sorted
    blocks of 16 rows take 64 x 128 tiles (at 64 tokens of Qwen3-30B-A3B's sizes on the H100, 539 us
    against 781 us for the narrower tiles; benchmark_results/moe/moe-kernels-h100.json).
    benchmarks/bench_moe.py measures others."""
    if per_pair:
        return {"gate_up": (32, 64, 4, 3), "down_sum": (16, 256, 4, 3)}
    if block_m == 16:
        return {"gate_up": (64, 128, 4, 3), "down": (64, 128, 4, 3)}
    return {"gate_up": (64, 64, 4, 3), "down": (64, 64, 4, 3)}


def _with_defaults(settings: dict | None, block_m: int, per_pair: bool) -> dict:
    """launch_settings, overridden by the given ones; given "down" settings run down and the sum apart."""
    chosen = launch_settings(block_m, per_pair)
    if settings:
        if "down" in settings:
            chosen.pop("down_sum", None)
        chosen.update(settings)
    return chosen


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, settings: dict[str, tuple[int, int, int, int]] | None = None,
              per_pair_max: int = PER_PAIR_MAX_PAIRS) -> torch.Tensor:
    """x [num_tokens, hidden], w13 [experts, 2 * inter, hidden], w2 [experts, hidden, inter] -> [num_tokens,
    hidden]: what fused_moe_ref computes. `settings` overrides some of launch_settings (benchmarks; "down"
    runs the down GEMM and the sum apart) and `per_pair_max` the most pairs that skip the sort."""
    num_tokens, hidden = x.shape
    num_experts, inter = w2.shape[0], w2.shape[2]
    top_k = topk_ids.shape[1]
    pairs = num_tokens * top_k
    per_pair = pairs <= per_pair_max
    if per_pair:                                    # decode: a block per pair, no sort
        block_m = 16
        sorted_ids, block_experts = one_pair_per_block(pairs, block_m, x.device), topk_ids.flatten().to(torch.int32)
    else:
        block_m = _block_m(pairs, num_experts)
        sorted_ids, block_experts = moe_align(topk_ids, num_experts, block_m)
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    settings = _with_defaults(settings, block_m, per_pair)
    h = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    block_n, block_k, warps, stages = settings["gate_up"]
    grid = (len(block_experts), triton.cdiv(inter, block_n))
    _gate_up_kernel[grid](x, w13, h, sorted_ids, block_experts, pairs, hidden, inter, x.stride(0), w13.stride(0),
                          w13.stride(1), TOP_K=top_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                          DOT_PRECISION=dot_precision(x.dtype), num_warps=warps, num_stages=stages)
    weights = topk_weights.flatten().float().contiguous()
    if per_pair and "down_sum" in settings:         # down and the sum over top_k in one launch
        block_n, block_k, warps, stages = settings["down_sum"]
        out = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
        _down_sum_kernel[(num_tokens, triton.cdiv(hidden, block_n))](
            h, w2, out, weights, block_experts, inter, hidden, w2.stride(0), w2.stride(1), TOP_K=top_k,
            BLOCK_N=block_n, BLOCK_K=block_k, K_TILES=triton.cdiv(inter, block_k), num_warps=warps,
            num_stages=stages)
        return out
    block_n, block_k, warps, stages = settings["down"]
    y = torch.empty(pairs, hidden, dtype=x.dtype, device=x.device)
    grid = (len(block_experts), triton.cdiv(hidden, block_n))
    _down_kernel[grid](h, w2, y, weights, sorted_ids, block_experts, pairs, inter,
                       hidden, w2.stride(0), w2.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                       DOT_PRECISION=dot_precision(x.dtype), num_warps=warps, num_stages=stages)
    return y.view(num_tokens, top_k, hidden).sum(dim=1)     # accumulated in float32, rounded once
