"""Sampling kernels for the GPU: a categorical draw from softmax(logits / T) that reads the logits once.

The reference (`sample_ref` in sampler.py) builds the whole softmax, its cumulative sum over the
vocabulary and searches it for u * total, with one uniform u in (0, 1] per row: the token t with
cdf[t - 1] < u * total <= cdf[t] (inverse-CDF sampling). A batch of 256 rows of Qwen3's 151,936 logits
makes that several passes over 39M floats. Here the vocabulary is cut into chunks of BLOCK_V tokens:
  1. `_chunk_stats_kernel`, one program per row and chunk, reads the chunk's logits once. In base 2,
     z = logit * log2(e) / T, it writes the chunk's max m_c and sum s_c = sum_j 2^(z_j - m_c) (the online
     softmax's statistics), and for greedy rows the chunk's largest raw logit and its first index.
  2. `_pick_kernel`, one program per row, weighs the chunks w_c = s_c * 2^(m_c - M) (M the row's max),
     finds the chunk where their cumulative sum first reaches u * sum_c w_c, and scans only that chunk:
     its cumulative sum of 2^(z_j - m_c) against the remainder, in the chunk's own units. Rows with
     temperature 0 take the first index of the largest logit, as torch.argmax does.
So the logits are read once, plus one chunk per row; the only random numbers are the u's. The chunked sums
round differently from the reference's single cumulative sum: the token differs only when u * total lands
within a rounding error of a boundary between two tokens.
"""
import torch
import triton
import triton.language as tl

__all__ = ["sample"]
BLOCK_V = 4096


@triton.jit
def _chunk_stats_kernel(logits_ptr, temperatures_ptr, stats_ptr, argmax_ptr, stride_l, vocab_size,
                        num_chunks, BLOCK_V: tl.constexpr):
    row, chunk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = chunk * BLOCK_V + tl.arange(0, BLOCK_V)
    x = tl.load(logits_ptr + row * stride_l + offs, mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
    t = tl.load(temperatures_ptr + row)
    out = (row * num_chunks + chunk) * 2           # stats: [rows, num_chunks, 2] = (m_c, s_c)
    if t == 0:   # greedy: the chunk's largest logit and where it is first
        best, where = tl.max(x, axis=0, return_indices=True)
        tl.store(stats_ptr + out, best)
        tl.store(argmax_ptr + row * num_chunks + chunk, chunk * BLOCK_V + where)
    else:
        z = x * (1.4426950408889634 / t)
        m = tl.max(z, axis=0)
        tl.store(stats_ptr + out, m)
        tl.store(stats_ptr + out + 1, tl.where(m > float("-inf"), tl.sum(tl.exp2(z - m), axis=0), 0.0))


@triton.jit
def _pick_kernel(logits_ptr, temperatures_ptr, u_ptr, stats_ptr, argmax_ptr, out_ptr, stride_l, vocab_size,
                 num_chunks, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs_c = tl.arange(0, BLOCK_C)
    chunk_ok = offs_c < num_chunks
    m = tl.load(stats_ptr + (row * num_chunks + offs_c) * 2, mask=chunk_ok, other=float("-inf"))
    t = tl.load(temperatures_ptr + row)
    if t == 0:
        best_chunk = tl.argmax(m, axis=0)          # the first chunk holding the largest logit
        tl.store(out_ptr + row, tl.load(argmax_ptr + row * num_chunks + best_chunk))
    else:
        s = tl.load(stats_ptr + (row * num_chunks + offs_c) * 2 + 1, mask=chunk_ok, other=0.0)
        top = tl.max(m, axis=0)
        w = s * tl.exp2(m - top)                   # each chunk's share of the row's total, unnormalized
        cdf = tl.cumsum(w, axis=0)
        target = tl.load(u_ptr + row) * tl.max(cdf, axis=0)
        c = tl.min(tl.where(cdf >= target, offs_c, BLOCK_C), axis=0)
        c = tl.minimum(c, num_chunks - 1)
        before = tl.sum(tl.where(offs_c == c, cdf - w, 0.0), axis=0)
        m_c = tl.sum(tl.where(offs_c == c, m, 0.0), axis=0)
        rest = (target - before) / tl.exp2(m_c - top)   # in the chunk's units, 2^(z - m_c)
        offs = c * BLOCK_V + tl.arange(0, BLOCK_V)
        x = tl.load(logits_ptr + row * stride_l + offs, mask=offs < vocab_size, other=float("-inf"))
        p = tl.exp2(x.to(tl.float32) * (1.4426950408889634 / t) - m_c)
        hit = tl.min(tl.where((tl.cumsum(p, axis=0) >= rest) & (p > 0), offs, vocab_size), axis=0)
        # rounding may leave the remainder just above the chunk's sum: then its last possible token
        last = tl.max(tl.where(p > 0, offs, -1), axis=0)
        tl.store(out_ptr + row, tl.minimum(hit, last))


def sample(logits: torch.Tensor, temperatures: torch.Tensor, u: torch.Tensor, block_v: int = BLOCK_V) -> torch.Tensor:
    """logits [num_seqs, vocab] (rows contiguous), temperatures and u [num_seqs] float32 (u in (0, 1]) ->
    token ids [num_seqs] int64: argmax where the temperature is 0, else a draw from softmax(logits / T)."""
    num_seqs, vocab_size = logits.shape
    assert logits.stride(-1) == 1 and temperatures.shape == u.shape == (num_seqs,)
    assert temperatures.dtype == u.dtype == torch.float32
    num_chunks = triton.cdiv(vocab_size, block_v)
    stats = torch.empty(num_seqs, num_chunks, 2, dtype=torch.float32, device=logits.device)
    argmax = torch.empty(num_seqs, num_chunks, dtype=torch.int64, device=logits.device)
    out = torch.empty(num_seqs, dtype=torch.int64, device=logits.device)
    _chunk_stats_kernel[(num_seqs, num_chunks)](logits, temperatures, stats, argmax, logits.stride(0), vocab_size,
                                                num_chunks, BLOCK_V=block_v, num_warps=8)
    _pick_kernel[(num_seqs,)](logits, temperatures, u, stats, argmax, out, logits.stride(0), vocab_size, num_chunks,
                              BLOCK_V=block_v, BLOCK_C=triton.next_power_of_2(num_chunks), num_warps=8)
    return out
