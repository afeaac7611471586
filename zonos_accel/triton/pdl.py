"""Programmatic dependent launch (PDL) for our Triton kernels (Hopper and later).

A kernel launched with PDL may start while the kernel before it on the stream is still running, once every
program of that kernel has signalled ``griddepcontrol.launch_dependents`` (or exited). Each of our kernels
begins with :func:`enter`: ``griddepcontrol.wait`` first, so nothing is read or written before the previous
kernel has finished and its writes are visible (stream order holds), then ``launch_dependents``, so the next
PDL kernel can be scheduled right away instead of after this one drains. In the decode step that hides the
launch gap between consecutive kernels, and lets the CuTeDSL GEMV (``use_cute_gemv``), which streams its
weights before its own wait, start reading them while the norm or activation before it runs. Kernels
launched without PDL (e.g. under torch ops) treat both instructions as no-ops.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

ENABLED = True  # benchmarks/decode_step.py measures the step with and without (ops "triton-nopdl")


@functools.cache
def _supported(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def options(device: torch.device) -> dict:
    """Launch keywords for one of our kernels on ``device``: the ``GDC`` constexpr that :func:`enter` reads
    and Triton's ``launch_pdl``."""
    if device.type != "cuda":  # Triton's interpreter (TRITON_INTERPRET=1) runs the kernels on CPU tensors
        return {"GDC": False, "launch_pdl": False}
    index = device.index if device.index is not None else torch.cuda.current_device()
    on = ENABLED and _supported(index)
    return {"GDC": on, "launch_pdl": on}


@triton.jit
def enter(GDC: tl.constexpr):
    """First statement of each kernel (see the module docstring)."""
    if GDC:
        gdc_wait()
        gdc_launch_dependents()
