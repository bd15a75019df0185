"""AWQ W4A16 (AutoAWQ's GEMM format): 4-bit weights with a scale and a zero point per group of inputs.

For a linear layer y = x W with W [in, out] (note: transposed relative to nn.Linear's weight):
    qweight int32 [in, out / 8]          eight 4-bit values per int32, along the output dim
    qzeros  int32 [in / group, out / 8]  packed the same way
    scales  fp16  [in / group, out]
    W[i, o] = (q[i, o] - z[i // group, o]) * s[i // group, o]
AutoAWQ interleaves the eight values in an int32: nibble n (bits 4n..4n+3) holds output column
AWQ_ORDER[n] of its group of eight, so column j sits at bit shift AWQ_SHIFTS[j] = 4 * inverse(AWQ_ORDER)[j].

After loading, each layer is repacked once into the kernel layout (as vLLM repacks AWQ for Marlin):
    qweight int32 [in / 8, out]          eight 4-bit values per int32, along the input dim
    zeros   fp16  [in / group, out]      z itself (exact in fp16)
    scales  fp16  [in / group, out]      unchanged
Word row g * R + r (R = group / 8 rows per group) of column o holds in nibble i (bits 4i..4i+3) the
input k = g * group + i * R + r. A kernel then finds the eight values of a word in one column and one
group, and the eight slices "nibble i of rows r = 0..R-1" are each R consecutive inputs.
The reference path dequantizes the full weight, then matmuls (the CPU path); the Triton kernels
(triton_awq.py, triton_awq_gemv.py) unpack and scale inside the matmul. The checkpoint's settings and the
linear method that holds a layer's tensors and dispatches to the kernels are in awq_method.py.
"""
import torch

PACK = 8
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_SHIFTS = [4 * AWQ_ORDER.index(j) for j in range(PACK)]     # [0, 16, 4, 20, 8, 24, 12, 28]


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 [rows, cols / 8] -> int32 [rows, cols] of values 0..15 in natural column order."""
    shifts = torch.tensor(AWQ_SHIFTS, dtype=torch.int32, device=packed.device)
    return ((packed[:, :, None] >> shifts) & 0xF).flatten(1)


def as_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words of 32 bits -> int32 with the same bits (the top nibble may set the sign)."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """int [rows, cols] of 0..15 -> int32 [rows, cols / 8] in AutoAWQ's interleaved order."""
    shifts = torch.tensor(AWQ_SHIFTS, dtype=torch.int64, device=values.device)
    grouped = values.to(torch.int64).view(values.shape[0], -1, PACK) << shifts
    return as_int32(grouped.sum(dim=-1))                    # disjoint bits: the sum is the OR


def dequantize_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 W [in, out]."""
    q, z = unpack_awq(qweight), unpack_awq(qzeros)
    z = z.repeat_interleave(group_size, dim=0)
    s = scales.float().repeat_interleave(group_size, dim=0)
    return (q - z).float() * s


def repack_awq(qweight: torch.Tensor, qzeros: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAWQ's qweight [in, out / 8] and qzeros -> the kernel layout: qweight [in / 8, out], zeros fp16."""
    q = unpack_awq(qweight)                                        # [in, out]
    rows = group_size // PACK
    q = q.view(q.shape[0] // group_size, PACK, rows, -1).to(torch.int64)   # [group, nibble i, row r, out]
    words = sum(q[:, i] << (4 * i) for i in range(PACK)).flatten(0, 1)     # [in / 8, out]
    return as_int32(words), unpack_awq(qzeros).to(torch.float16)


def kernel_layout(tensors: dict[str, torch.Tensor], group_size: int) -> dict[str, torch.Tensor]:
    """A checkpoint layer's {qweight, qzeros, scales} -> {qweight, zeros, scales} in the kernel layout."""
    qweight, zeros = repack_awq(tensors["qweight"], tensors["qzeros"], group_size)
    return {"qweight": qweight, "zeros": zeros, "scales": tensors["scales"]}


def dequantize_packed(qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                      group_size: int) -> torch.Tensor:
    """float32 W [in, out] from the kernel layout (see the module docstring)."""
    rows = group_size // PACK
    words = qweight.view(-1, rows, qweight.shape[1])                      # [group, row r, out]
    q = torch.stack([(words >> (4 * i)) & 0xF for i in range(PACK)], dim=1).flatten(0, 2)   # [in, out]
    z, s = (t.float().repeat_interleave(group_size, 0) for t in (zeros, scales))
    return (q.float() - z) * s


def awq_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                 group_size: int) -> torch.Tensor:
    """x [tokens, in] -> [tokens, out] with weights in the kernel layout: dequantize, then matmul (the
    specification and the CPU path)."""
    return x @ dequantize_packed(qweight, zeros, scales, group_size).to(x.dtype)
