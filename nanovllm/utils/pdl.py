"""Programmatic dependent launch (PDL, Hopper and newer): let a kernel start before the one ahead of it ends.

At batch 1 a decode step is ~10 kernels per layer of a few microseconds each, and each kernel boundary costs
a launch and the latency of the first loads while the GPU mostly idles. A kernel launched with
`launch_pdl=True` may start as soon as the kernel ahead of it has released it (`gdc_launch_dependents()`,
PTX griddepcontrol.launch_dependents), and `gdc_wait()` (griddepcontrol.wait) splits it in two: the part
before may only read what no earlier kernel writes (an AWQ GEMV's weights), the part after sees everything
the kernel ahead wrote, which in turn had waited for its own predecessor.

The decode-step kernels (RMSNorm, q/k norm + RoPE, KV store, attention and its combine, the AWQ GEMV and
wgmma kernels) take a `PDL` constexpr: wait, then release the next kernel, first thing (the AWQ kernels
load their first weight group before waiting). So the GEMV's programs take free SMs and stream weights
while the norm or attention before them finishes, and every other launch overlaps the tail before it.
cuBLAS kernels neither wait nor release: the kernel after one starts when it ends, as without PDL.
Rule that keeps it correct: a PDL-launched kernel reads activations and writes anything only after
`gdc_wait()`. The instructions exist from sm_90 on and not in the CPU interpreter.
NANOVLLM_PDL=0 turns it off (to measure what it brings); it is read once per process and device.
"""
import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@functools.cache
def pdl_launch(device: torch.device) -> dict:
    """Launch arguments of a kernel with a `PDL` constexpr: the constexpr and Triton's launch option (cached:
    every kernel launch asks)."""
    enabled = (device.type == "cuda" and os.environ.get("NANOVLLM_PDL", "1") != "0"
               and not os.environ.get("TRITON_INTERPRET") and torch.cuda.get_device_capability(device)[0] >= 9)
    return {"PDL": enabled, "launch_pdl": enabled}


@triton.jit
def wait_then_release(PDL: tl.constexpr):
    """A Triton kernel's first step: wait for the kernel before, then let the next one start."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
