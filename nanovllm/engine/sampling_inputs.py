"""Per-row sampling settings on the device, built once per batch composition.

Consecutive decode steps of the same sequences reuse the tensors. On CUDA the values go through pinned
staging buffers (utils/pinned.py) with an asynchronous copy.
"""
import numpy as np
import torch

from nanovllm.engine.sequence import Sequence
from nanovllm.layers.sampler import SamplingTensors
from nanovllm.utils.pinned import PinnedDoubleBuffer


class SamplingInputs:
    """Builds SamplingTensors for a list of sequences, caching the last one."""

    def __init__(self, max_num_seqs: int, device: torch.device, vocab_size: int):
        self.device, self.vocab_size = device, vocab_size
        self.key, self.cached = None, None
        if device.type == "cuda":
            self.staging = PinnedDoubleBuffer([(4 * max_num_seqs, torch.float32)], device)
            self.max_num_seqs = max_num_seqs

    def tensors(self, seqs: list[Sequence]) -> SamplingTensors:
        key = tuple(seq.seq_id for seq in seqs)
        if key != self.key:
            self.key, self.cached = key, self._build(seqs)
        return self.cached

    def _build(self, seqs: list[Sequence]) -> SamplingTensors:
        params = [seq.sampling_params for seq in seqs]
        for seq in seqs:
            if seq.sampling_params.seed is not None and seq.generator is None:
                seq.generator = torch.Generator(device=self.device).manual_seed(seq.sampling_params.seed)
        n = len(seqs)
        # [4, n]: one row per setting, filled field by field (a list of floats converts quickly, nested lists not)
        rows = np.empty((4, n), dtype=np.float32)
        rows[0], rows[1] = [p.temperature for p in params], [p.top_k for p in params]
        rows[2], rows[3] = [p.top_p for p in params], [p.min_p for p in params]
        needs_filter = bool((rows[1] > 0).any() or (rows[2] < 1.0).any() or (rows[3] > 0.0).any())
        all_greedy = bool((rows[0] == 0.0).all())
        rows[1][rows[1] <= 0] = self.vocab_size     # top_k 0 (or -1): keep the whole vocabulary
        values = torch.from_numpy(rows)
        if self.device.type == "cuda":   # [4, max_num_seqs] views of the staging buffers, rows filled to n
            (host,) = self.staging.next_host()
            host.view(4, self.max_num_seqs)[:, :n].copy_(values)
            self.staging.upload([host])
            values = self.staging.devices[0].view(4, self.max_num_seqs)[:, :n]
        temperatures, top_ks, top_ps, min_ps = values
        return SamplingTensors(
            temperatures=temperatures, top_ks=top_ks, top_ps=top_ps, min_ps=min_ps,
            generators=[seq.generator for seq in seqs],
            needs_filter=needs_filter, all_greedy=all_greedy)
