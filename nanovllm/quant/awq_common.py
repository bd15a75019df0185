"""What the AWQ kernels share (the fused Triton GEMM, the Triton and Gluon GEMVs, the Gluon wgmma kernel):
the nibble-to-float trick, the split-K partial sums and their tile counters, the tuned-table folder and
lookup, and Gluon's names when this Triton has Gluon. The kernels import this module, never each other's
helpers; the dispatcher (`triton_awq.awq_gemm`) imports the kernels.
"""
import os

import torch
import triton
import triton.language as tl

from nanovllm.utils.tuned import num_sms

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:          # a Triton without Gluon: awq_gemv keeps the Triton kernel
    gluon = gl = gdc_launch_dependents = gdc_wait = None

# Triton 3.6 calls the CTA-wide barrier thread_barrier, later versions barrier
cta_barrier = (getattr(gl, "barrier", None) or gl.thread_barrier) if gl is not None else None
MAGIC_BITS = 0x43000000   # 128.0 in float32, see magic_nibble
MAX_TILES = 1 << 16        # split-K counters, one per output tile
TUNED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned")


@triton.jit
def magic_nibble(words, i: tl.constexpr, magic):
    """128 + nibble i of each int32 word, as float32 with no conversion instruction: the nibble is moved to
    bits 16..19 and OR-ed into 128.0 = 0x43000000 (`magic`), whose mantissa bit 16 is worth exactly 1.
    `magic` is a kernel argument, not a literal, so that mask and OR fit one LOP3 (one immediate and one
    constant-bank operand; two immediates take two instructions)."""
    if i < 4:
        v = words << (16 - 4 * i)
    elif i > 4:
        v = words >> (4 * i - 16)
    else:
        v = words
    return ((v & 0x000F0000) | magic).to(tl.float32, bitcast=True)


@triton.jit
def finish_split_k(y, out_ptrs, partial_ptrs, split_stride, count_ptr, mask, split, split_k):
    """Store y: directly, or as one of split_k partials that the last program adds up (also called by the
    Gluon kernels)."""
    if split_k == 1:
        tl.store(out_ptrs, y.to(out_ptrs.dtype.element_ty), mask=mask)
    else:
        tl.store(partial_ptrs + split * split_stride, y, mask=mask)
        tl.debug_barrier()                       # every thread's partial is written before the count says so
        if tl.atomic_add(count_ptr, 1, sem="acq_rel") == split_k - 1:
            total = tl.load(partial_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
            for s in range(1, split_k):
                total += tl.load(partial_ptrs + s * split_stride, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptrs.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr, 0)


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def tile_counters(device: torch.device) -> torch.Tensor:
    """Zeroed int32 counters, one per output tile, kept zero by the kernels themselves. Allocated on the
    first (eager) call: a CUDA graph captured later must keep pointing at the same memory. One set per
    device, so two split-K AWQ kernels must not run at once on two streams (the engine uses one)."""
    if device not in _COUNTERS:
        assert not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()), \
            "run awq_gemv once outside CUDA-graph capture first (the engine's warm-up does)"
        _COUNTERS[device] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def split_k_buffers(M: int, N: int, split_k: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                            torch.Tensor]:
    """(output [M, N] in x's dtype, float32 partials [split_k, M, N] (the output itself when not split),
    the tile counters) for a kernel that ends in `finish_split_k`."""
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    partial = torch.empty(split_k, M, N, dtype=torch.float32, device=x.device) if split_k > 1 else out
    return out, partial, tile_counters(x.device)


def split_k_for(per_sm: int, tiles: int, num_groups: int, device: torch.device) -> int:
    """K splits that put ~per_sm programs on every SM for `tiles` output tiles, in whole groups (>= 1 each)."""
    return max(1, min(triton.cdiv(per_sm * num_sms(device), tiles), num_groups))


def measured_at(num_tokens: int, table: list[tuple[int, object]]):
    """The entry of a [(token count, choice)] table, sorted by count, measured at the nearest count at or
    above num_tokens (the largest count's beyond it); None for an empty table."""
    return next((choice for tokens, choice in table if num_tokens <= tokens), table[-1][1] if table else None)
