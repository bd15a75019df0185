"""GPU time of small kernels as the engine runs them: captured in a CUDA graph and replayed.

Timed eagerly, a launch that does tens of microseconds of GPU work times the host instead (a Triton
launch costs the CPU 10-30 us, a torch op about 5): the decode and batch-1 kernels the benchmarks compare
are that small, and the engine replays them from CUDA graphs.
"""
import torch
import triton


def graph_us(calls: list) -> float:
    """Median GPU microseconds per call of `calls` (functions of no argument), all captured in one CUDA
    graph in order and the graph replayed. Each call is run once before the capture (compiles, caches)."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    us = 1e3 * triton.testing.do_bench(graph.replay, warmup=10, rep=50, return_mode="median") / len(calls)
    del graph
    return us
