"""Host staging buffers for per-step inputs and outputs that cross between host and GPU every step.

Two sets of pinned (page-locked) host buffers are used in turn: step N writes its set while the copy of
step N-1's may still be in flight, and a copy from pinned memory is asynchronous (from pageable memory it
would wait for the GPU and stall the overlapped step pipeline).
"""
import torch


class PinnedDoubleBuffer:
    """Two sets of pinned host buffers (one per dtype/length given), used in turn, and optionally one set of
    device buffers of the same shapes that the host values are copied into."""

    def __init__(self, specs: list[tuple[int, torch.dtype]], device: torch.device | str | None = None):
        pin = torch.cuda.is_available()     # pinned memory needs a CUDA device (a CPU test gets plain memory)
        self.hosts = [[torch.zeros(n, dtype=dtype, pin_memory=pin) for n, dtype in specs] for _ in range(2)]
        self.devices = [torch.zeros(n, dtype=dtype, device=device) for n, dtype in specs] if device else []
        self.turn = 0

    def next_host(self) -> list[torch.Tensor]:
        """The host set this step may write (the other may still be copying)."""
        hosts = self.hosts[self.turn]
        self.turn ^= 1
        return hosts

    def upload(self, hosts: list[torch.Tensor], widths: list[int | None] | None = None) -> None:
        """Copy each host buffer (its first `width` values, or all) to its device buffer, asynchronously."""
        for i, (host, device) in enumerate(zip(hosts, self.devices)):
            width = widths[i] if widths and widths[i] is not None else host.shape[0]
            device[:width].copy_(host[:width], non_blocking=True)
