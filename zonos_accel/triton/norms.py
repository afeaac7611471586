"""Residual add + LayerNorm (``zonos.ops.add_layer_norm``) as one Triton kernel.

The reference is two launches per norm (the add, then torch's LayerNorm, which gives a (2, 2048) decode
input two thread blocks and ~5 µs on the H200); a Zonos-v0.1-hybrid step has 59 of them. One program per
row here reads hidden and residual once, writes the rounded sum and the normalized row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zonos_accel.triton import pdl
from zonos_accel.triton.pdl import enter


@triton.jit
def _add_layer_norm_kernel(
    h_ptr,
    r_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    sum_ptr,
    n,
    stride_h,
    stride_r,
    stride_o,
    stride_s,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
    GDC: tl.constexpr,
):
    enter(GDC)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(h_ptr + row * stride_h + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(sum_ptr.dtype.element_ty)  # rounded like a torch add
        tl.store(sum_ptr + row * stride_s + cols, x, mask=ok)
    xf = x.to(tl.float32)
    mean = tl.sum(xf, axis=0) / n
    centered = tl.where(ok, xf - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n + eps)
    y = centered * rstd * tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def add_layer_norm(
    hidden: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`zonos.ops.norms.add_layer_norm` (the reference it is tested against)."""
    shape = hidden.shape
    n = shape[-1]
    h = hidden.reshape(-1, n)
    if h.stride(-1) != 1:
        h = h.contiguous()
    r = None if residual is None else residual.reshape(-1, n)
    if r is not None and r.stride(-1) != 1:
        r = r.contiguous()
    out = torch.empty(h.shape, device=h.device, dtype=h.dtype)
    total = h if r is None else torch.empty(h.shape, device=h.device, dtype=torch.promote_types(h.dtype, r.dtype))
    block = triton.next_power_of_2(n)
    _add_layer_norm_kernel[(h.shape[0],)](
        h,
        r if r is not None else h,
        weight,
        bias if bias is not None else weight,
        out,
        total,
        n,
        h.stride(0),
        r.stride(0) if r is not None else 0,
        out.stride(0),
        total.stride(0),
        eps,
        HAS_RESIDUAL=r is not None,
        HAS_BIAS=bias is not None,
        BLOCK=block,
        num_warps=min(max(block // 256, 1), 8),
        **pdl.options(h.device),
    )
    return out.reshape(shape), (hidden if residual is None else total.reshape(shape))
