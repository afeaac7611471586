"""Activations that are not plain torch functions."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul(h: torch.Tensor) -> torch.Tensor:
    """The gated MLP's activation: h (..., 2H) = [value | gate] → value · SiLU(gate) (..., H), in h's dtype
    (SiLU rounded to it before the product, as two torch ops round)."""
    value, gate = h.chunk(2, dim=-1)
    return value * F.silu(gate)
