"""Shared helpers for the tests of our GPU kernels, which run on a CUDA device or in Triton's interpreter."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
TARGETS = ["interpreter", pytest.param("cuda", marks=pytest.mark.gpu)]  # the ``params`` of a kernel-device fixture


def kernel_device(target: str) -> torch.device:
    """The device a kernel test runs on for ``target`` ("interpreter" or "cuda"), or a skip saying what is missing.

    The interpreter runs the kernels on the CPU when the suite starts with TRITON_INTERPRET=1 (set later, the
    interpreter cannot run their nested jit functions)."""
    if target == "cuda" and (INTERPRET or not torch.cuda.is_available()):
        pytest.skip("needs a CUDA device (and TRITON_INTERPRET unset)")
    if target == "interpreter" and not INTERPRET:
        pytest.skip("run with TRITON_INTERPRET=1 to interpret the kernels on the CPU")
    if target == "interpreter" and tuple(map(int, np.__version__.split(".")[:2])) >= (2, 3):
        pytest.skip("Triton's interpreter fails with numpy >= 2.3: pip install 'numpy<2.3'")
    pytest.importorskip("triton")
    return torch.device("cuda" if target == "cuda" else "cpu")


def kernel_dtypes(device: torch.device) -> list[torch.dtype]:
    """The dtypes a kernel test covers: Triton's interpreter rounds bf16 differently from the GPU (numpy has no bf16),
    so fp16 stands in for it there."""
    return [torch.float32, torch.bfloat16] if device.type == "cuda" else [torch.float32, torch.float16]


def poison_allocator(device: torch.device) -> None:
    """Fill the CUDA caching allocator's free memory with NaN, so an output element a kernel never writes shows."""
    if device.type == "cuda":
        junk = torch.full((64 << 20,), float("nan"), device=device)
        del junk


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; a non-finite output fails."""
    assert torch.isfinite(out).all(), "non-finite output"
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()
