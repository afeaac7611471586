"""The Mamba2 decode step between its two projections, as one op: the one-token conv (+ SiLU) on x, B and C, the
SSD recurrence, then the gated RMSNorm with z. A backend may run it as one fused kernel; the reference is the
composition of the three ops it fuses (:func:`compose_step_tail`), and a backend that replaces any of those three
composes its own (:class:`zonos.ops.backend.Backend`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from zonos.ops.conv import conv_step
from zonos.ops.norms import gated_rms_norm
from zonos.ops.ssd import ssd_step

PARTS = ("conv_step", "ssd_step", "gated_rms_norm")  # the ops mamba_step_tail is made of, in order


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
        tickets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One token of a Mamba2 mixer after ``in_proj``: ``xbc`` (b, conv_dim) through the conv step on
        ``conv_state`` (b, conv_dim, k), split into x, B, C; the SSD step on ``ssm_state`` (b, h, p, n) with the raw
        step ``dt`` (b, h) (softplus(dt + dt_bias)), decay rates ``A`` (h,) and skip ``D`` (h,); then RMSNorm(y ·
        SiLU(z)) · ``norm_weight`` over groups of d_inner / g channels. Updates both states in place; returns
        (b, d_inner) in xbc's dtype, the input of ``out_proj``. ``tickets`` (b, g) int32 zeros: scratch a fused
        kernel may count with and must leave zero (unused here)."""
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
