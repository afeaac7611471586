"""Depthwise causal convolution of the Mamba2 mixer: whole-sequence and one-token forms."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zonos.ops.precision import compute_dtype


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, context: torch.Tensor | None = None
) -> torch.Tensor:
    """Depthwise causal conv over (b, l, c) followed by SiLU.

    ``weight`` is (c, 1, k). ``context`` (b, c, k) holds the inputs preceding x (the decode cache
    layout: oldest first); None means zeros, i.e. the start of the sequence.
    """
    k = weight.shape[-1]
    xt = x.transpose(1, 2)  # (b, c, l)
    if context is None:
        xt = F.pad(xt, (k - 1, 0))
    else:
        xt = torch.cat([context[..., 1:].to(xt.dtype), xt], dim=-1)
    y = F.conv1d(xt, weight, bias, groups=weight.shape[0])
    return F.silu(y).transpose(1, 2)


def conv_step(
    conv_state: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """One token: shift ``conv_state`` (b, c, k) left, append x (b, c), return SiLU(conv) (b, c)."""
    conv_state.copy_(torch.cat([conv_state[..., 1:], x[..., None].to(conv_state.dtype)], dim=-1))
    cdt = compute_dtype(x.dtype)
    y = torch.einsum("bck,ck->bc", conv_state.to(cdt), weight[:, 0].to(cdt))
    if bias is not None:
        y = y + bias.to(cdt)
    return F.silu(y).to(x.dtype)


def conv_context(
    x: torch.Tensor, k: int, previous: torch.Tensor | None = None, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """The last k inputs (b, c, k) after consuming x (b, l, c), for the decode cache.

    ``valid`` (b,) on the device: row i consumed only its first ``valid[i]`` tokens of x (the rest is padding of a
    batch of unequal lengths), so its context ends there.
    """
    xt = x.transpose(1, 2)
    # Before the sequence's start (no ``previous``) the inputs are zeros, as causal_conv1d pads.
    xt = F.pad(xt, (k, 0)) if previous is None else torch.cat([previous.to(xt.dtype), xt], dim=-1)
    if valid is None:
        return xt[..., -k:]
    # Row i's context is columns end - k .. end - 1 with end = its valid tokens' end in the joined sequence.
    end = xt.shape[-1] - x.shape[1] + valid
    columns = end[:, None] - k + torch.arange(k, device=x.device)  # (b, k)
    return xt.gather(2, columns[:, None, :].expand(-1, xt.shape[1], -1))
