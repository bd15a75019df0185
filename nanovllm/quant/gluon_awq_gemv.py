"""AWQ GEMV for one token (decode at batch 1) in Gluon: the same math as triton_awq_gemv.py, with the
thread layout written out instead of left to the compiler.

Why a second kernel: the Triton GEMV is bound by its arithmetic, not by its loads (with no weight or x
loads in its loop it still takes 79% of its time; awq_benchmark.md). Triton gives each thread 16 bytes of
words per row (4 columns), so every x value a thread loads and widens serves 4 columns; that and the
shift per nibble make ~5 instructions per weight. Gluon (`triton.experimental.gluon`) lets the kernel say
which thread holds what:
- The tile of a group's words is [TR, R, BLOCK_N]: a thread holds R = 2 consecutive word rows (inputs) x
  C = 8 columns (two 16-byte loads per row), TR = 8 lanes go down the 16 rows, 4 lanes x 4 warps across
  128 columns. Each x value now serves 8 columns, a thread's x of one nibble are R consecutive inputs
  (one load), and the sum over its rows stays inside the thread.
- Fewer shifts: nibble i is moved only to bits 8-11, 12-15 or 16-19 (words, words << 8, words >> 12) and
  OR-ed into the float whose mantissa bit there is worth 1 (32768.0, 2048.0 or 128.0), so the float is
  offset + q with offset 32768, 2048 or 128 by nibble (`nibble_at`); the offsets come off per group through
  x's offset-weighted sum, as the zero point does through x's plain sum. The largest offset keeps ~15 bits
  of q * x in float32: enough for 16-bit inputs, not for float32 ones, which keep the Triton GEMV.
Together ~3.4 instructions per weight instead of ~5, and faster than the Triton GEMV on every 8B layer
(docs/features/int4_awq_w4a16/awq_benchmark.md). Split-K and its fixup are the Triton GEMV's (`finish_split_k`).
SwiGLU's down projection can take [gate | up] as is (GATED): each program first computes silu(gate) * up
of its own groups into shared memory (float32, MAX_GROUPS groups), and its loop reads x from there, so the
activation kernel between gate_up and down goes away at batch 1 (`AWQLinearMethod.apply_silu_and_mul`).
On Hopper the kernel is launched with PDL (utils/pdl.py): it loads its first weight group while the kernel
before it still runs, and waits for that kernel only before it reads x.
Gluon does not run under the CPU interpreter: the CPU path and the CPU tests use the Triton kernels, the
GPU tests check this one against the reference. Reference: `awq_gemm_ref` (dequantize, then matmul).
"""
import functools

import torch
import triton

from nanovllm.quant.awq_common import (
    MAGIC_BITS,
    MAX_TILES,
    TUNED_DIR,
    cta_barrier,
    finish_split_k,
    gdc_launch_dependents,
    gdc_wait,
    gl,
    gluon,
    split_k_buffers,
    split_k_for,
)
from nanovllm.utils.pdl import pdl_launch
from nanovllm.utils.tuned import device_name, read_tuned

__all__ = ["gated_split_k", "gluon_awq_gemv", "gluon_supported"]
GROUP = 128                  # the tile's 16 word rows are one group
R, C, TR, WARPS = 2, 8, 8, 4
BLOCK_N = C * (32 // TR) * WARPS
MAGIC_12, MAGIC_8 = 0x45000000, 0x47000000     # 2048.0 and 32768.0: mantissa bit 12 / bit 8 worth 1
MAX_GATED_GROUPS = 32        # a gated program's activations: 32 groups of 128 float32 = 16 KB of shared memory


def gluon_supported(x: torch.Tensor, group_size: int) -> bool:
    """One 16-bit token of group 128 on an Ampere or newer GPU, with a Triton that has Gluon."""
    return (gluon is not None and x.is_cuda and x.shape[0] == 1 and group_size == GROUP
            and x.dtype in (torch.float16, torch.bfloat16) and ampere_or_newer(x.device))


@functools.cache
def ampere_or_newer(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 8


if gluon is not None:
    @gluon.jit
    def masked_float(v, bit: gl.constexpr, magic_16, magic_12, magic_8):
        """The nibble at bits bit..bit+3 of v, OR-ed into the float whose mantissa bit `bit` is worth 1."""
        if bit == 16:
            return ((v & 0x000F0000) | magic_16).to(gl.float32, bitcast=True)
        elif bit == 12:
            return ((v & 0x0000F000) | magic_12).to(gl.float32, bitcast=True)
        else:
            return ((v & 0x00000F00) | magic_8).to(gl.float32, bitcast=True)

    @gluon.jit
    def nibble_at(words, i: gl.constexpr, magic_16, magic_12, magic_8):
        """(offset + nibble i of each word as float32, offset): from words, words << 8 or words >> 12."""
        if i == 0:
            return masked_float(words << 8, 8, magic_16, magic_12, magic_8), 32768.0
        elif i == 1:
            return masked_float(words << 8, 12, magic_16, magic_12, magic_8), 2048.0
        elif i == 2:
            return masked_float(words, 8, magic_16, magic_12, magic_8), 32768.0
        elif i == 3:
            return masked_float(words, 12, magic_16, magic_12, magic_8), 2048.0
        elif i == 4:
            return masked_float(words, 16, magic_16, magic_12, magic_8), 128.0
        elif i == 5:
            return masked_float(words >> 12, 8, magic_16, magic_12, magic_8), 32768.0
        elif i == 6:
            return masked_float(words >> 12, 12, magic_16, magic_12, magic_8), 2048.0
        else:
            return masked_float(words >> 12, 16, magic_16, magic_12, magic_8), 128.0

    @gluon.jit
    def _gluon_awq_gemv_kernel(x_ptr, qweight_ptr, zeros_ptr, scales_ptr, out_ptr, partial_ptr, count_ptr, N, K,
                               split_k, magic_16, magic_12, magic_8, R: gl.constexpr, C: gl.constexpr,
                               TR: gl.constexpr, WARPS: gl.constexpr, GATED: gl.constexpr, MAX_GROUPS: gl.constexpr,
                               PDL: gl.constexpr):
        ROWS: gl.constexpr = R * TR
        GROUP_SIZE: gl.constexpr = ROWS * 8
        BLOCK_N: gl.constexpr = C * (32 // TR) * WARPS
        tile: gl.constexpr = gl.BlockedLayout([1, R, C], [TR, 1, 32 // TR], [1, 1, WARPS], [2, 1, 0])
        x_layout: gl.constexpr = gl.SliceLayout(2, tile)            # [TR, R]: the inputs of a thread's rows
        acc_layout: gl.constexpr = gl.SliceLayout(1, tile)          # [TR, BLOCK_N]: rows summed in the thread
        col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)    # [BLOCK_N]
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        lane_row = gl.arange(0, TR, layout=gl.SliceLayout(1, x_layout))
        in_thread = gl.arange(0, R, layout=gl.SliceLayout(0, x_layout))
        rows = gl.expand_dims(lane_row, 1) * R + gl.expand_dims(in_thread, 0)          # [TR, R]
        cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
        cols_3d = gl.expand_dims(gl.expand_dims(pid_n * BLOCK_N + gl.arange(
            0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(1, tile))), 0), 1)  # [1, 1, BLOCK_N]
        w_ptrs = qweight_ptr + gl.expand_dims(rows, 2) * N + cols_3d
        per_split = gl.cdiv(K // GROUP_SIZE, split_k)
        start = pid_k * per_split
        end = gl.minimum(start + per_split, K // GROUP_SIZE)
        live = gl.where(start < end, N, 0)
        words = gl.load(w_ptrs + start * ROWS * N, mask=cols_3d < live, other=0)
        s = gl.load(scales_ptr + start * N + cols, mask=cols < live, other=0.0)
        z = gl.load(zeros_ptr + start * N + cols, mask=cols < live, other=0.0)
        if PDL:         # above: weights only; below: x and the outputs, once the kernel before has finished
            gdc_wait()
            gdc_launch_dependents()
        if GATED:       # x = silu(gate) * up of this program's groups, computed once into shared memory
            staged: gl.constexpr = gl.BlockedLayout([1, R], [32, 1], [WARPS, 1], [1, 0])
            pair = gl.arange(0, 8 * TR, layout=gl.SliceLayout(1, staged))
            row = gl.arange(0, R, layout=gl.SliceLayout(0, staged))
            in_group = gl.expand_dims(pair, 1) * R + gl.expand_dims(row, 0)          # [8 * TR, R]: input i * 16 + r
            x_groups = gl.allocate_shared_memory(gl.float32, [MAX_GROUPS, 8 * TR, R],
                                                 gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
            for q in gl.static_range(MAX_GROUPS):
                k = (start + q) * GROUP_SIZE + in_group
                ok = (start + q < end) & (in_group < GROUP_SIZE)
                gate = gl.load(x_ptr + k, mask=ok, other=0.0).to(gl.float32)
                up = gl.load(x_ptr + K + k, mask=ok, other=0.0).to(gl.float32)
                x_groups.index(q).store((gate / (1.0 + gl.exp(-gate)) * up).to(x_ptr.dtype.element_ty).to(gl.float32))
            cta_barrier()
        acc = gl.zeros([TR, BLOCK_N], gl.float32, layout=acc_layout)
        for g in range(start, end):
            live = gl.where(g + 1 < end, N, 0)                  # the next group's loads, one group ahead
            words_next = gl.load(w_ptrs + (g + 1) * ROWS * N, mask=cols_3d < live, other=0)
            s_next = gl.load(scales_ptr + (g + 1) * N + cols, mask=cols < live, other=0.0)
            z_next = gl.load(zeros_ptr + (g + 1) * N + cols, mask=cols < live, other=0.0)
            part = gl.zeros([TR, R, BLOCK_N], gl.float32, layout=tile)
            x_sum = gl.zeros([TR, R], gl.float32, layout=x_layout)
            x_offset = gl.zeros([TR, R], gl.float32, layout=x_layout)
            for i in gl.static_range(8):
                if GATED:
                    x = x_groups.index(g - start).slice(i * TR, TR).load(x_layout)
                else:
                    x = gl.load(x_ptr + g * GROUP_SIZE + i * ROWS + rows).to(gl.float32)
                w, offset = nibble_at(words, i, magic_16, magic_12, magic_8)
                part += gl.expand_dims(x, 2) * w
                x_sum += x
                x_offset += x * offset
            # y[n] += s (sum_k x_k (offset_k + q_k) - sum_k x_k offset_k - z sum_k x_k), rows in the thread
            xs = gl.expand_dims(gl.convert_layout(gl.sum(x_sum, axis=1), gl.SliceLayout(1, acc_layout)), 1)
            xo = gl.expand_dims(gl.convert_layout(gl.sum(x_offset, axis=1), gl.SliceLayout(1, acc_layout)), 1)
            scale = gl.expand_dims(s.to(gl.float32), 0)
            acc += (gl.sum(part, axis=1) - xo) * scale - xs * (scale * gl.expand_dims(z.to(gl.float32), 0))
            words = words_next
            s = s_next
            z = z_next
        y = gl.sum(acc, axis=0)                                  # across the TR lanes, once
        finish_split_k(y, out_ptr + cols, partial_ptr + cols, N, count_ptr + pid_n, cols < N, pid_k, split_k)


@functools.cache
def tuned_split(gpu_name: str, k: int, n: int) -> int | None:
    """The split-K that benchmarks/bench_gemm.py --sweep-gemv --write measured fastest for [k, n] on this GPU
    model, None if it was not measured."""
    return read_tuned(TUNED_DIR, "awq", gpu_name).get("gluon_gemv_by_shape", {}).get(f"{k}x{n}")


def gluon_awq_gemv(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                   split_k: int | None = None, gated: bool = False) -> torch.Tensor:
    """x [1, K] -> [1, N] in x's dtype (`gluon_supported`). split_k None: measured for this shape, else
    ~4 programs per SM (what won on most 8B layers). gated: x is [1, 2K] = [gate | up] and the input is
    silu(gate) * up (SwiGLU's activation, `silu_and_mul`), computed by each program for its own groups;
    `gated_split_k` gives a split that fits."""
    K, N = x.shape[1] // (2 if gated else 1), scales.shape[1]
    assert gluon_supported(x, K // zeros.shape[0]) and x.stride(-1) == 1
    tiles = triton.cdiv(N, BLOCK_N)
    assert tiles <= MAX_TILES
    split_k = split_k or default_split(x.device, K, N)
    max_groups = groups_per_program(K, split_k) if gated else 1
    assert max_groups <= MAX_GATED_GROUPS, f"{split_k} splits of {K // GROUP} groups leave too many per program"
    out, partial, counters = split_k_buffers(1, N, split_k, x)
    _gluon_awq_gemv_kernel[(tiles, split_k)](
        x, qweight, zeros, scales, out, partial, counters, N, K, split_k, MAGIC_BITS, MAGIC_12, MAGIC_8,
        R=R, C=C, TR=TR, WARPS=WARPS, GATED=gated, MAX_GROUPS=max_groups, num_warps=WARPS,
        **pdl_launch(x.device))
    return out


def default_split(device: torch.device, k: int, n: int) -> int:
    """Measured for [k, n] on this GPU model, else ~4 programs per SM."""
    return tuned_split(device_name(device), k, n) or split_k_for(4, triton.cdiv(n, BLOCK_N), k // GROUP, device)


def groups_per_program(k: int, split_k: int) -> int:
    """The groups one of split_k programs covers, rounded up to a power of 2 (a gated program's x buffer)."""
    return triton.next_power_of_2(triton.cdiv(k // GROUP, split_k))


def gated_split_k(x: torch.Tensor, k: int, n: int) -> int | None:
    """The split-K at which the down projection [k, n] takes silu(gate) * up of x = [1, 2k] in the kernel,
    None if it cannot: no Gluon GEMV here, or its split leaves more than MAX_GATED_GROUPS groups (16 KB of
    shared memory) to a program."""
    if not gluon_supported(x, GROUP):
        return None
    split_k = default_split(x.device, k, n)
    return split_k if groups_per_program(k, split_k) <= MAX_GATED_GROUPS else None
