"""Rotary position embedding in both pairings the published checkpoints use.

The hybrid's attention (mamba_ssm MHA with flash-attn rotary) rotates half-split pairs (i, i + d/2);
the transformer's rotates interleaved pairs (2i, 2i + 1). Getting this wrong loads fine and sounds wrong.
"""

from __future__ import annotations

import torch

from zonos.ops.precision import compute_dtype


def rotary_cos_sin(
    positions: torch.Tensor, rotary_dim: int, base: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (..., rotary_dim / 2) for integer ``positions`` (any shape), rounded to ``dtype``
    (flash-attn caches them in the activation dtype)."""
    cdt = compute_dtype(dtype)
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, device=positions.device, dtype=cdt) / rotary_dim))
    angles = positions.to(cdt)[..., None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` channels of x (b, l, heads, d); cos/sin are (l, r) or (b, l, r)."""
    r = cos.shape[-1]
    cdt = compute_dtype(x.dtype)
    rot, rest = x[..., : 2 * r].to(cdt), x[..., 2 * r :]
    cos = cos.to(cdt).unsqueeze(-2)  # broadcast over heads
    sin = sin.to(cdt).unsqueeze(-2)
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., :r], rot[..., r:]
        out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return torch.cat([out.to(x.dtype), rest], dim=-1)


def rotary_qk(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, rotary_dim: int, base: float, interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries (b, l, hq, d) and keys (b, l, hk, d) at integer ``positions`` (l,) shared by the batch or
    (b, l) per row, with cos/sin rounded to the activation dtype as :func:`rotary_cos_sin` does."""
    cos, sin = rotary_cos_sin(positions, rotary_dim, base, q.dtype)
    return apply_rotary(q, cos, sin, interleaved), apply_rotary(k, cos, sin, interleaved)


def rotate_and_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    rotary_dim: int,
    base: float,
    interleaved: bool,
) -> torch.Tensor:
    """The attention layer's step between its projection and the attention: rotate queries (b, l, hq, d) and
    keys (b, l, hk, d) at integer ``positions`` ((l,) shared by the batch, or (b, l): each row's own; no rotation
    when ``rotary_dim`` is 0), store the keys and values (b, l, hk, d) in the caches (b, max_seqlen, hk, d) at
    rows ``positions``, and return the rotated queries. One op, so a fast path can do it in one launch."""
    if rotary_dim:
        q, k = rotary_qk(q, k, positions, rotary_dim, base, interleaved)
    if positions.dim() == 1:
        k_cache.index_copy_(1, positions, k)
        v_cache.index_copy_(1, positions, v)
    else:
        rows = positions[..., None, None].expand(-1, -1, *k.shape[2:])  # (b, l, hk, d)
        k_cache.scatter_(1, rows, k)
        v_cache.scatter_(1, rows, v)
    return q
