"""Per-row sampling settings on the device, built once per batch composition.

Consecutive decode steps of the same sequences reuse the tensors. On CUDA the values go through pinned
staging buffers (utils/pinned.py) with an asynchronous copy.
"""
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
        values = torch.tensor([[p.temperature for p in params],
                               [p.top_k if p.top_k > 0 else self.vocab_size for p in params],
                               [p.top_p for p in params], [p.min_p for p in params]], dtype=torch.float32)
        if self.device.type == "cuda":   # [4, max_num_seqs] views of the staging buffers, rows filled to n
            (host,) = self.staging.next_host()
            host.view(4, self.max_num_seqs)[:, :n].copy_(values)
            self.staging.upload([host])
            values = self.staging.devices[0].view(4, self.max_num_seqs)[:, :n]
        temperatures, top_ks, top_ps, min_ps = values
        return SamplingTensors(
            temperatures=temperatures, top_ks=top_ks, top_ps=top_ps, min_ps=min_ps,
            generators=[seq.generator for seq in seqs],
            needs_filter=any(p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0 for p in params),
            all_greedy=all(p.greedy for p in params))
