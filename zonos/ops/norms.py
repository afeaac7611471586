"""Normalizations that are not plain torch modules."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zonos.ops.precision import compute_dtype


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int) -> torch.Tensor:
    """RMSNorm(x · SiLU(z)) · weight, normalized over groups of ``group_size`` channels.

    Mamba2's output norm with the gate applied before normalizing (mamba_ssm's ``norm_before_gate=False``).
    Computes in at least float32, returns x's dtype.
    """
    cdt = compute_dtype(x.dtype)
    h = x.to(cdt) * F.silu(z.to(cdt))
    shape = h.shape
    h = h.reshape(*shape[:-1], shape[-1] // group_size, group_size)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h.reshape(shape) * weight.to(cdt)).to(x.dtype)


def add_layer_norm(
    hidden: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pre-norm block entry: residual ← hidden + residual (hidden alone when residual is None), then
    LayerNorm over the last dimension. Returns (normalized, residual); the sum is rounded to the
    activation dtype before it is normalized, as two separate torch ops would do."""
    residual = hidden if residual is None else hidden + residual
    return F.layer_norm(residual, residual.shape[-1:], weight, bias, eps), residual
