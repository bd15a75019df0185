"""AWQ GEMM on Hopper tensor cores (wgmma) in Gluon, for batches of tokens (decode at batch 8-128):
y [M, N] = x [M, K] @ W [K, N], W dequantized in registers and never written anywhere.

Why: from ~64 tokens the Triton kernels lose to dequantizing the whole weight into a bf16 temporary and
calling cuBLAS (triton_awq.py), which writes and reads 4 bytes per weight besides the half byte AWQ saves.
The Triton tensor-core kernel makes the weight the dot's right operand, which wgmma reads from shared
memory only, so every dequantized slice is stored to shared memory and synchronized before its dot.

Here the product is computed transposed, y^T = W^T x^T, so the weight is the left operand, which wgmma
takes from registers:
- A (registers): a [BLOCK_N, 16] slice of W^T. In the kernel layout of awq.py, word row g * 16 + r holds
  in nibble i the input k = g * 128 + i * 16 + r, so slice i of a group is nibble i of its 16 word rows.
  The words are loaded straight into the A-operand layout (`DotOperandLayout`): each thread gets the 8
  words of the rows and columns its fragments cover, and unpacks all 8 nibbles of each (no word is
  loaded twice, no weight goes through shared memory). The A fragment pairs inputs k, k + 1 of one
  column in a register, and those are the same nibble of two words: PRMT, a shift, a LOP3, an FMA and a
  MUL by the column's scale make the two 16-bit weights (q - z) s of one register (`nibble_asm`), ~2.5
  instructions per weight instead of ~3.5 for float32 (128 + q) s - (128 + z) s and a conversion.
- B (shared memory): x^T of the group, 8 slices of [16, BLOCK_M], copied in by cp.async one group ahead.
- The 8 wgmmas of a group run asynchronously while the next slices are dequantized; one wait per group
  frees its x buffer. Two warpgroups (8 warps) take 64 output columns each (BLOCK_N = 128).
- The accumulator [BLOCK_N, BLOCK_M] is float32; K is split over programs when the tiles are too few to
  fill the GPU, with the same last-program fixup as the other AWQ kernels (`finish_split_k`).
At 16-64 tokens it beats the Triton tensor-core kernel and dequantize + cuBLAS on the 8B layers; at 256
tokens dequantize + cuBLAS still wins (docs/features/int4_awq_w4a16/awq_benchmark.md).
Hopper only (wgmma); Gluon has no CPU interpreter, so the GPU tests check it against `awq_gemm_ref`.
"""
import functools

import torch
import triton

from nanovllm.quant.awq_common import (
    MAX_TILES,
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

if gluon is not None:
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    # cp.async into shared memory: async_copy_global_to_shared in Triton 3.6, async_load from 3.7
    _copy_to_shared = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

__all__ = ["gluon_awq_mma", "mma_supported"]
GROUP = 128                      # its 16 word rows: the depth of one wgmma
# two 16-bit floats whose lowest mantissa bit is worth 1: 128.0 in bf16, 1024.0 in fp16 (`nibble_asm`)
MAGIC_PAIR = {True: 0x43004300, False: 0x64006400}
BLOCK_N, WARPS = 128, 8          # two warpgroups, 64 output columns (wgmma's 64 rows) each
# awq_gemm's methods for this kernel -> (columns per program, warps); "mma256": four warpgroups, so each
# program covers twice the columns and x is read from L2 half as often
TILES = {"mma": (BLOCK_N, WARPS), "mma256": (256, 16)}
REGISTERS_PER_SM = 65536


def mma_supported(x: torch.Tensor, group_size: int) -> bool:
    """16-bit tokens of group 128 on a Hopper GPU, with a Triton that has Gluon."""
    return (gluon is not None and x.is_cuda and group_size == GROUP and x.dtype in (torch.float16, torch.bfloat16)
            and hopper(x.device))


@functools.cache
def hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] == 9


def block_m_for(num_tokens: int) -> int:
    """Tokens per program: wgmma's N, 16 to 64 (within a few percent of the best of 16-128 per 8B layer at
    16-256 tokens, and 64 accumulator registers per thread)."""
    return min(64, max(16, triton.next_power_of_2(num_tokens)))


def programs_per_sm(num_tokens: int) -> int:
    """Split K until ~2 programs per SM up to 64 tokens, ~1 above: one program per SM was faster at 128
    tokens, the two tie at 64, and two are faster at 16 (docs/features/int4_awq_w4a16/awq_benchmark.md)."""
    return 2 if num_tokens <= 64 else 1


def register_cap(warps: int) -> dict:
    """Launch option capping registers per thread so that one program of `warps` warps fits on an SM: none for
    8 warps (the kernel needs ~141 of the 255 allowed), 128 for 16 warps (no spills with Triton 3.6)."""
    cap = REGISTERS_PER_SM // (32 * warps)
    return {"maxnreg": cap} if cap < 255 else {}


@triton.constexpr_function
def nibble_asm(i: int, bf16: bool) -> str:
    """PTX for one 32-bit A register: (q - z) s of nibble i of two words (inputs k, k + 1 of one column) as
    two 16-bit floats. PRMT puts the two words' low (nibbles 0-3) or high halves (4-7) side by side, a shift
    brings nibble i to bits 0-3 of each half, LOP3 ORs in the float 128.0 (bf16, 0x4300) or 1024.0 (fp16,
    0x6400), whose lowest mantissa bit is worth 1, so the halves read magic + q; one FMA by 1.0 adds
    -(magic + z) (`minus_offset_pairs`, $3), exact: q - z is a small integer; one MUL by the scale pair
    (`scale_pairs`, $5) rounds (q - z) s to the activation dtype once, as the float32 path does."""
    select = "0x5410" if i < 4 else "0x7632"
    one, kind = ("0x3F803F80", "bf16x2") if bf16 else ("0x3C003C00", "f16x2")
    return (f"{{ .reg .b32 t, one; prmt.b32 t, $1, $2, {select}; shr.b32 t, t, {4 * (i % 4)}; "
            f"lop3.b32 t, t, 0x000F000F, {MAGIC_PAIR[bf16]:#x}, 0xEA; mov.b32 one, {one}; fma.rn.{kind} t, t, one, $3; "
            f"mul.rn.{kind} $0, t, $5; }}")


@triton.constexpr_function
def magic_pair(bf16: bool) -> int:
    return MAGIC_PAIR[bf16]


if gluon is not None:
    @gluon.jit
    def nibble_pairs(words, offsets, scales, i: gl.constexpr, BF16: gl.constexpr):
        """Slice i of a group in the A-operand layout: (q - z) s of nibble i of words [BLOCK_N, 16], whose
        consecutive pairs (word rows 2j, 2j + 1: inputs k, k + 1) fill one register (`nibble_asm`)."""
        return gl.inline_asm_elementwise(nibble_asm(i, BF16), "=r,r,r,r,r,r,r", [words, offsets, scales],
                                         dtype=gl.bfloat16 if BF16 else gl.float16, is_pure=True, pack=2)

    @gluon.jit
    def minus_offset_pairs(z, BF16: gl.constexpr):
        """-(magic + z) twice, as two 16-bit floats in an int32, for z the zero point (an integer 0..15)."""
        zi = z.to(gl.int32)
        return magic_pair(BF16) | (zi << 16) | zi | -0x7FFF8000       # -0x7FFF8000: the sign bits 0x80008000

    @gluon.jit
    def scale_pairs(s, BF16: gl.constexpr):
        """s twice, as two 16-bit floats of the activation dtype in an int32."""
        bits = s.to(gl.bfloat16 if BF16 else gl.float16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        return (bits << 16) | bits

    @gluon.jit
    def _gluon_awq_mma_kernel(x_ptr, qweight_ptr, zeros_ptr, scales_ptr, out_ptr, partial_ptr, count_ptr,
                              M, N, K, stride_xm, stride_om, split_k, BLOCK_N: gl.constexpr,
                              BLOCK_M: gl.constexpr, WARPS: gl.constexpr, BF16: gl.constexpr, PDL: gl.constexpr):
        ROWS: gl.constexpr = 16
        GROUP_SIZE: gl.constexpr = ROWS * 8
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        x_shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)
        x_copy: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [WARPS, 1], [1, 0])    # 16-byte cp.async
        pid_n, pid_m, pid_k = gl.program_id(0), gl.program_id(1), gl.program_id(2)
        num_n = gl.cdiv(N, BLOCK_N)
        num_groups = K // GROUP_SIZE
        per_split = gl.cdiv(num_groups, split_k)
        start = pid_k * per_split
        end = gl.minimum(start + per_split, num_groups)

        # W^T slices in the A-operand layout: words [BLOCK_N, ROWS] = word rows r of the group, columns n
        cols_a = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, a_layout))
        rows_a = gl.arange(0, ROWS, layout=gl.SliceLayout(0, a_layout))
        w_ptrs = qweight_ptr + gl.expand_dims(rows_a, 0) * N + gl.expand_dims(cols_a, 1)
        col_ok = gl.expand_dims(cols_a < N, 1)
        # a group's x as 8 slices of [BLOCK_M, ROWS] stacked: row j of [8 * BLOCK_M, ROWS] is token
        # j % BLOCK_M of slice j // BLOCK_M, i.e. x[token, g * 128 + (j // BLOCK_M) * 16 + r]
        j = gl.arange(0, 8 * BLOCK_M, layout=gl.SliceLayout(1, x_copy))
        tokens_c = pid_m * BLOCK_M + j % BLOCK_M
        rows_c = gl.arange(0, ROWS, layout=gl.SliceLayout(0, x_copy))
        x_ptrs = (x_ptr + gl.expand_dims(tokens_c * stride_xm + (j // BLOCK_M) * ROWS, 1)
                  + gl.expand_dims(rows_c, 0))
        x_ok = gl.expand_dims(tokens_c < M, 1) & gl.expand_dims(rows_c < ROWS, 0)
        x_buf = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [2, 8 * BLOCK_M, ROWS], x_shared)  # 2 groups

        live = gl.where(start < end, N, 0)
        words = gl.load(w_ptrs + start * ROWS * N, mask=col_ok & (cols_a < live)[:, None], other=0)
        s = gl.load(scales_ptr + start * N + cols_a, mask=cols_a < live, other=0.0)
        z = gl.load(zeros_ptr + start * N + cols_a, mask=cols_a < live, other=0.0)
        if PDL:         # above: weights only; below: x and the outputs, once the kernel before has finished
            gdc_wait()
            gdc_launch_dependents()
        _copy_to_shared(x_buf.index(0), x_ptrs + start * GROUP_SIZE, mask=x_ok & (start < end))   # first group
        async_copy.commit_group()
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        for g in range(start, end):
            stage = (g - start) % 2
            async_copy.wait_group(0)              # this group's x has landed (this thread's copies)
            fence_async_shared()                  # ... is visible to wgmma
            cta_barrier()                        # ... for every thread, and the other buffer is free again
            if g + 1 < end:
                _copy_to_shared(x_buf.index(1 - stage), x_ptrs + (g + 1) * GROUP_SIZE, mask=x_ok)
            async_copy.commit_group()
            live = gl.where(g + 1 < end, N, 0)    # the next group's weights, one group ahead
            words_next = gl.load(w_ptrs + (g + 1) * ROWS * N, mask=col_ok & (cols_a < live)[:, None], other=0)
            s_next = gl.load(scales_ptr + (g + 1) * N + cols_a, mask=cols_a < live, other=0.0)
            z_next = gl.load(zeros_ptr + (g + 1) * N + cols_a, mask=cols_a < live, other=0.0)
            offsets = gl.expand_dims(minus_offset_pairs(z, BF16), 1)
            scales = gl.expand_dims(scale_pairs(s, BF16), 1)
            x_group = x_buf.index(stage)
            for i in gl.static_range(8):          # slice i's unpacking overlaps the wgmmas before it
                w = nibble_pairs(words, offsets, scales, i, BF16)                     # (q - z) s
                acc = warpgroup_mma(w, x_group.slice(i * BLOCK_M, BLOCK_M).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])   # before the next group's barrier frees this x buffer
            words = words_next
            s = s_next
            z = z_next

        cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        tokens = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
        ok = gl.expand_dims(cols < N, 1) & gl.expand_dims(tokens < M, 0)
        out_ptrs = out_ptr + gl.expand_dims(tokens, 0) * stride_om + gl.expand_dims(cols, 1)
        partial_ptrs = partial_ptr + gl.expand_dims(tokens, 0) * N + gl.expand_dims(cols, 1)
        finish_split_k(acc, out_ptrs, partial_ptrs, M * N, count_ptr + pid_m * num_n + pid_n, ok, pid_k, split_k)


def gluon_awq_mma(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                  split_k: int | None = None, block_m: int | None = None, block_n: int = BLOCK_N,
                  warps: int = WARPS, per_sm: int | None = None) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype (`mma_supported`), weights in the kernel layout of awq.py.
    block_n: output columns per program, a multiple of 16 per warp (the pairs in TILES); split_k None:
    ~per_sm programs per SM (None: `programs_per_sm`)."""
    (M, K), N = x.shape, scales.shape[1]
    assert mma_supported(x, K // zeros.shape[0]) and x.stride(-1) == 1 and block_n % (16 * warps) == 0
    block_m = block_m or block_m_for(M)
    grid_n, grid_m = triton.cdiv(N, block_n), triton.cdiv(M, block_m)
    assert grid_n * grid_m <= MAX_TILES
    split_k = split_k or split_k_for(per_sm or programs_per_sm(M), grid_n * grid_m, K // GROUP, x.device)
    out, partial, counters = split_k_buffers(M, N, split_k, x)
    _gluon_awq_mma_kernel[(grid_n, grid_m, split_k)](
        x, qweight, zeros, scales, out, partial, counters, M, N, K, x.stride(0), out.stride(0), split_k,
        BLOCK_N=block_n, BLOCK_M=block_m, WARPS=warps, BF16=x.dtype == torch.bfloat16, num_warps=warps,
        **register_cap(warps), **pdl_launch(x.device))
    return out
