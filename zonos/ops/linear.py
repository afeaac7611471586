"""The backbone's projections and the codebook heads: y = x Wᵀ (+ b).

The reference is ``F.linear`` (cuBLAS on CUDA). ``zonos_accel.gemv.cute_gemv_backend()`` routes the
decode-shaped calls (a few rows of x) to a CuTeDSL GEMV that streams each weight once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) · weight (N, K)ᵀ (+ bias (N,)) → (..., N)."""
    return F.linear(x, weight, bias)
