"""Mamba2's gated RMSNorm (``zonos.ops.gated_rms_norm``) as one Triton kernel.

RMSNorm(x · SiLU(z)) · weight over groups of ``group_size`` channels. The reference takes five elementwise
and reduction launches; here one program owns one group of one row: it reads x and z once, reduces in fp32
and writes the normalized, weighted group in x's dtype.
"""

from __future__ import annotations

import torch

from zonos_accel.triton import pdl
from zonos_accel.triton._support import check_tensors, tl, triton
from zonos_accel.triton.pdl import enter

MAX_GROUP = 1 << 16  # one program holds its whole group in registers
# H200, benchmarks/mamba_decode_ops.py (d_inner 4096, one group, 34 layers in one graph): 2.1 / 2.0 / 2.0 / 6.7 µs
# per layer at 1 / 2 / 16 / 512 rows against mamba_ssm's fused norm at 2.3 / 2.6 / 2.7 / 5.9.


@triton.jit
def _gated_rms_norm_kernel(
    x_ptr,
    z_ptr,
    w_ptr,
    y_ptr,
    group_size,
    stride_x,
    stride_z,
    stride_y,
    eps,
    BLOCK: tl.constexpr,
    GDC: tl.constexpr,
):
    enter(GDC)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * group_size + tl.arange(0, BLOCK)
    ok = tl.arange(0, BLOCK) < group_size
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + row * stride_z + cols, mask=ok, other=0.0).to(tl.float32)
    h = x * (z * tl.sigmoid(z))
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / group_size + eps)
    y = h * rstd * tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=ok)


def _rows(t: torch.Tensor, width: int) -> torch.Tensor:
    """(..., width) as (rows, width) with unit column stride, a view where the strides allow."""
    t = t.reshape(-1, width)
    return t if t.stride(-1) == 1 else t.contiguous()


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.norms.gated_rms_norm` (the reference it is tested against): returns x's
    dtype, computes in fp32. x and z may be strided views (the mixer's split projection)."""
    check_tensors("gated_rms_norm", x=x, z=z, weight=weight)
    width = x.shape[-1]
    if z.shape != x.shape or weight.shape != (width,):
        raise ValueError(
            f"gated_rms_norm takes x and z of one shape (..., d) and weight (d,); got x {tuple(x.shape)}, "
            f"z {tuple(z.shape)}, weight {tuple(weight.shape)}"
        )
    if group_size < 1 or width % group_size or group_size > MAX_GROUP:
        raise ValueError(f"gated_rms_norm: group_size {group_size} must divide the width {width} and be <= {MAX_GROUP}")
    x2, z2 = _rows(x, width), _rows(z, width)
    y = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    if y.numel() == 0:
        return y.reshape(x.shape)
    block = triton.next_power_of_2(group_size)
    _gated_rms_norm_kernel[(x2.shape[0], width // group_size)](
        x2,
        z2,
        weight.contiguous(),
        y,
        group_size,
        x2.stride(0),
        z2.stride(0),
        y.stride(0),
        eps,
        BLOCK=block,
        num_warps=min(max(block // 512, 1), 8),
        **pdl.options(x.device),
    )
    return y.reshape(x.shape)
