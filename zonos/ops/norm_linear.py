"""A pre-norm block's entry and the projection after it, as composite ops: ``add_layer_norm_linear`` (residual add,
LayerNorm, a projection: an attention block's qkv) and ``add_layer_norm_glu`` (the same into a gated MLP's fc1 and its
activation). Each is the composition of its parts (:func:`compose_norm_linear`, :func:`compose_norm_glu`); a
backend composes them of its own parts and may serve the decode-shaped calls with a fused kernel
(:class:`zonos.ops.backend.Fused`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from zonos.ops.activations import silu_mul
from zonos.ops.linear import linear
from zonos.ops.norms import add_layer_norm

NORM_LINEAR_PARTS = ("add_layer_norm", "linear")
NORM_GLU_PARTS = ("add_layer_norm", "linear", "silu_mul")


def compose_norm_linear(add_norm: Callable, linear: Callable) -> Callable:
    """:func:`add_layer_norm_linear` made of the given ``add_layer_norm`` and ``linear``."""

    def add_layer_norm_linear(
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        norm_bias: torch.Tensor | None,
        eps: float,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """residual ← hidden + residual (hidden alone when None), LayerNorm of it, then ``weight`` (N, d) (+
        ``bias``). ``hidden`` and ``residual`` (..., d); returns (the projection (..., N), the new residual)."""
        normed, residual = add_norm(hidden, residual, norm_weight, norm_bias, eps)
        return linear(normed, weight, bias), residual

    return add_layer_norm_linear


def compose_norm_glu(add_norm: Callable, linear: Callable, silu_mul: Callable) -> Callable:
    """:func:`add_layer_norm_glu` made of the given ``add_layer_norm``, ``linear`` and ``silu_mul``."""

    def add_layer_norm_glu(
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        norm_bias: torch.Tensor | None,
        eps: float,
        weight: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """residual ← hidden + residual (hidden alone when None), LayerNorm of it, then the gated MLP's first half:
        ``weight`` (2H, d) into [value | gate] and value · SiLU(gate). Returns (the activation (..., H), the new
        residual)."""
        normed, residual = add_norm(hidden, residual, norm_weight, norm_bias, eps)
        return silu_mul(linear(normed, weight)), residual

    return add_layer_norm_glu


add_layer_norm_linear = compose_norm_linear(add_layer_norm, linear)
add_layer_norm_glu = compose_norm_glu(add_layer_norm, linear, silu_mul)
