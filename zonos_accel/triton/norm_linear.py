"""A pre-norm block's entry fused into the projection after it (``zonos.ops.add_layer_norm_linear`` and
``add_layer_norm_glu``) for decode-shaped calls: one fused GEMV (:mod:`zonos_accel.triton.gemv`) with the residual
add and LayerNorm in its prologue (and, for the gated MLP, value · SiLU(gate) in its epilogue), where the op-by-op path
launches the norm, the projection (and cuBLAS's split-K reduction) and the activation."""

from __future__ import annotations

import torch

from zonos_accel.triton import gemv
from zonos_accel.triton._support import check_tensors


def fits(hidden: torch.Tensor, residual: torch.Tensor | None, *rest, **named) -> bool:
    """Whether the fused GEMV serves this call (:func:`gemv.serves` of its rows: all dims but the last); the backend
    composes the op of its parts for the rest."""
    rows = hidden.numel() // max(hidden.shape[-1], 1)
    same = residual is None or residual.shape == hidden.shape
    return same and gemv.serves(hidden, rows, hidden.shape[-1])


def _norm_gemv(op, hidden, residual, norm_weight, norm_bias, eps, weight, bias, epilogue):
    check_tensors(op, hidden=hidden, residual=residual, norm_weight=norm_weight, norm_bias=norm_bias, weight=weight,
                  bias=bias)  # fmt: skip
    shape = hidden.shape
    d = shape[-1]
    if weight.shape[-1] != d or (residual is not None and residual.shape != shape):
        raise ValueError(
            f"{op}: hidden {tuple(shape)}, residual {None if residual is None else tuple(residual.shape)} and weight "
            f"{tuple(weight.shape)} do not match"
        )
    x = hidden.reshape(-1, d).contiguous()
    r = None if residual is None else residual.reshape(-1, d).contiguous()
    if x.shape[0] > gemv.MAX_ROWS:
        raise ValueError(f"{op}'s fused GEMV takes at most {gemv.MAX_ROWS} rows, got {x.shape[0]}")
    out, total = gemv.gemv(
        x, weight.contiguous(), bias, prologue=gemv.LAYER_NORM, residual=r, norm_weight=norm_weight.contiguous(),
        norm_bias=None if norm_bias is None else norm_bias.contiguous(), eps=eps, epilogue=epilogue,
    )  # fmt: skip
    return out.reshape(*shape[:-1], out.shape[-1]), (hidden if residual is None else total.reshape(shape))


def add_layer_norm_linear(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor | None,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`zonos.ops.norm_linear.add_layer_norm_linear`, for the calls :func:`fits` accepts."""
    return _norm_gemv("add_layer_norm_linear", hidden, residual, norm_weight, norm_bias, eps, weight, bias, gemv.NONE)


def add_layer_norm_glu(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor | None,
    eps: float,
    weight: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`zonos.ops.norm_linear.add_layer_norm_glu`, for the calls :func:`fits` accepts."""
    if weight.shape[0] % 2:
        raise ValueError(f"add_layer_norm_glu: fc1's {weight.shape[0]} rows do not split into value and gate halves")
    return _norm_gemv("add_layer_norm_glu", hidden, residual, norm_weight, norm_bias, eps, weight, None, gemv.GLU)
