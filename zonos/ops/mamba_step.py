"""The Mamba2 decode step as composite ops.

``mamba_step_tail`` is the part between the two projections: the one-token conv (+ SiLU) on x, B and C, the SSD
recurrence, then the gated RMSNorm with z. ``mamba_block_step`` is a whole Mamba2 block's decode step: the block's
residual add and LayerNorm, ``in_proj``, the tail and ``out_proj``. Each is the composition of its parts
(:func:`compose_step_tail`, :func:`compose_block_step`); a backend composes them of its own parts, and may serve
the calls a fused kernel fits with that kernel (:class:`zonos.ops.backend.Fused`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from zonos.ops.conv import conv_step
from zonos.ops.linear import linear
from zonos.ops.norms import add_layer_norm, gated_rms_norm
from zonos.ops.ssd import ssd_step

PARTS = ("conv_step", "ssd_step", "gated_rms_norm")  # the ops mamba_step_tail is made of, in order
BLOCK_PARTS = ("add_layer_norm", "linear", "mamba_step_tail")  # the ops mamba_block_step is made of


def step_tail_shapes(conv_state: torch.Tensor, ssm_state: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(heads, headdim, state size, groups, d_inner) of a mixer from its caches: conv (b, d_inner + 2·g·n, k) and
    ssm (b, h, p, n)."""
    _, h, p, n = ssm_state.shape
    d_inner = h * p
    groups, rest = divmod(conv_state.shape[1] - d_inner, 2 * n)
    if rest or groups < 1 or h % groups:
        raise ValueError(
            f"mamba_step_tail: a conv state of {conv_state.shape[1]} channels does not hold x ({d_inner}) and B, C "
            f"of {n} per group for {h} heads"
        )
    return h, p, n, groups, d_inner


def compose_step_tail(conv: Callable, ssd: Callable, norm: Callable) -> Callable:
    """:func:`mamba_step_tail` made of the given ``conv_step``, ``ssd_step`` and ``gated_rms_norm``."""

    def mamba_step_tail(
        conv_state: torch.Tensor,
        xbc: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor | None,
        ssm_state: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        D: torch.Tensor,
        dt_bias: torch.Tensor,
        z: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
    ) -> torch.Tensor:
        """One token of a Mamba2 mixer after ``in_proj``: ``xbc`` (b, conv_dim) through the conv step on
        ``conv_state`` (b, conv_dim, k), split into x, B, C; the SSD step on ``ssm_state`` (b, h, p, n) with the raw
        step ``dt`` (b, h) (softplus(dt + dt_bias)), decay rates ``A`` (h,) and skip ``D`` (h,); then RMSNorm(y ·
        SiLU(z)) · ``norm_weight`` over groups of d_inner / g channels. Updates both states in place; returns
        (b, d_inner) in xbc's dtype, the input of ``out_proj``."""
        b = xbc.shape[0]
        h, p, n, g, d_inner = step_tail_shapes(conv_state, ssm_state)
        xbc = conv(conv_state, xbc, conv_weight, conv_bias)
        x, B, C = torch.split(xbc, [d_inner, g * n, g * n], dim=-1)
        y = ssd(
            ssm_state, x.reshape(b, h, p), dt, A, B.reshape(b, g, n), C.reshape(b, g, n), D=D, dt_bias=dt_bias,
            dt_softplus=True,
        )  # fmt: skip
        return norm(y.reshape(b, d_inner), z, norm_weight, eps, d_inner // g)

    return mamba_step_tail


mamba_step_tail = compose_step_tail(conv_step, ssd_step, gated_rms_norm)


def compose_block_step(add_norm: Callable, linear: Callable, tail: Callable) -> Callable:
    """:func:`mamba_block_step` made of the given ``add_layer_norm``, ``linear`` and ``mamba_step_tail``."""

    def mamba_block_step(
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        norm_bias: torch.Tensor | None,
        norm_eps: float,
        in_weight: torch.Tensor,
        conv_state: torch.Tensor,
        conv_weight: torch.Tensor,
        conv_bias: torch.Tensor | None,
        ssm_state: torch.Tensor,
        A: torch.Tensor,
        D: torch.Tensor,
        dt_bias: torch.Tensor,
        gate_weight: torch.Tensor,
        gate_eps: float,
        out_weight: torch.Tensor,
        counters: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token of a pre-norm Mamba2 block: ``residual`` ← ``hidden`` + ``residual`` (``hidden`` alone when
        None), LayerNorm (``norm_weight``, ``norm_bias``, ``norm_eps``), ``in_proj`` (``in_weight`` (2·d_inner +
        2·g·n + h, d), no bias) into [z | xBC | dt], :func:`mamba_step_tail` on the caches (updated in place) with
        the gated norm's ``gate_weight`` and ``gate_eps``, then ``out_proj`` (``out_weight`` (d, d_inner)).
        ``hidden`` and ``residual`` are (b, d); returns the mixer's output (b, d) and the new residual. ``counters``
        (h,) int32 zeros: scratch a fused kernel may count with and must leave zero (unused here)."""
        normed, residual = add_norm(hidden, residual, norm_weight, norm_bias, norm_eps)
        h, _, _, _, d_inner = step_tail_shapes(conv_state, ssm_state)
        z, xbc, dt = torch.split(linear(normed, in_weight), [d_inner, conv_state.shape[1], h], dim=-1)
        y = tail(conv_state, xbc, conv_weight, conv_bias, ssm_state, dt, A, D, dt_bias, z, gate_weight, gate_eps)
        return linear(y, out_weight), residual

    return mamba_block_step


mamba_block_step = compose_block_step(add_layer_norm, linear, mamba_step_tail)
