"""Rotary embedding of queries and keys (``zonos.ops.rotary_qk``) as one Triton launch per tensor.

The reference builds the cos/sin tables (arange, power, multiply, cos, sin, casts) and rotates q and k
with slices, products and cats: about 30 launches per attention layer at decode. Here each program
rotates one head vector of one token; cos and sin are computed in place from the position and rounded
to the activation dtype, as the reference rounds its tables.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

_inv_freq: dict[tuple, torch.Tensor] = {}


def inverse_frequencies(rotary_dim: int, base: float, device: torch.device) -> torch.Tensor:
    """1 / base^(2i / rotary_dim) in float32, computed exactly as the reference computes it (cached)."""
    key = (rotary_dim, base, device)
    if key not in _inv_freq:
        exponents = torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim
        _inv_freq[key] = 1.0 / (base**exponents)
    return _inv_freq[key]


@triton.jit
def _rotary_kernel(
    x_ptr,
    out_ptr,
    pos_ptr,
    inv_freq_ptr,
    seqlen,
    heads,
    stride_xb,
    stride_xl,
    stride_xh,
    d,
    HALF: tl.constexpr,
    HALF_P: tl.constexpr,
    DP: tl.constexpr,
    INTERLEAVED: tl.constexpr,
):
    token = tl.program_id(0)  # b * seqlen + l
    head = tl.program_id(1)
    b = token // seqlen
    l = token % seqlen
    src = x_ptr + b * stride_xb + l * stride_xl + head * stride_xh
    dst = out_ptr + (token * heads + head) * d
    j = tl.arange(0, HALF_P)
    j_ok = j < HALF
    if INTERLEAVED:
        i1 = 2 * j
        i2 = 2 * j + 1
    else:
        i1 = j
        i2 = j + HALF
    angle = tl.load(pos_ptr + l).to(tl.float32) * tl.load(inv_freq_ptr + j, mask=j_ok, other=0.0)
    cos = libdevice.cos(angle).to(out_ptr.dtype.element_ty).to(tl.float32)
    sin = libdevice.sin(angle).to(out_ptr.dtype.element_ty).to(tl.float32)
    x1 = tl.load(src + i1, mask=j_ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + i2, mask=j_ok, other=0.0).to(tl.float32)
    tl.store(dst + i1, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=j_ok)
    tl.store(dst + i2, (x1 * sin + x2 * cos).to(out_ptr.dtype.element_ty), mask=j_ok)
    rest = tl.arange(0, DP)
    rest_ok = (rest >= 2 * HALF) & (rest < d)
    tl.store(dst + rest, tl.load(src + rest, mask=rest_ok, other=0.0), mask=rest_ok)


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool) -> torch.Tensor:
    b, l, h, d = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(b, l, h, d, device=x.device, dtype=x.dtype)
    half = inv_freq.shape[0]
    _rotary_kernel[(b * l, h)](
        x,
        out,
        positions,
        inv_freq,
        l,
        h,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        d,
        HALF=half,
        HALF_P=triton.next_power_of_2(half),
        DP=triton.next_power_of_2(d),
        INTERLEAVED=interleaved,
        num_warps=1,
    )
    return out


def rotary_qk(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, rotary_dim: int, base: float, interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`zonos.ops.rotary.rotary_qk` (the reference it is tested against)."""
    inv_freq = inverse_frequencies(rotary_dim, base, q.device)
    positions = positions.contiguous()
    return _rotate(q, positions, inv_freq, interleaved), _rotate(k, positions, inv_freq, interleaved)
