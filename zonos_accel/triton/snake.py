"""Snake (``zonos.ops.snake``) as one Triton kernel.

Torch runs ``x + sin(alpha * x)**2 / (alpha + 1e-9)`` as seven launches (two on alpha, five over x), plus
a cast when the next conv computes in fp16; the DAC decoder calls it 29 times per decode, and the streaming
decoder per push.  One program here covers a tile of channels × samples of one batch row: it reads x and
alpha once, computes in fp32 with torch's roundings (no FMA contraction, a correctly rounded division) and
writes the result in the dtype the next conv wants, optionally into a view of that conv's input buffer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zonos.ops.snake import snake as reference_snake

TILE = 1024  # elements per program: channels × samples, the samples axis filled first


@triton.jit
def snake_fp32(x, alpha):
    """Snake of fp32 ``x`` with fp32 ``alpha`` (broadcast), rounded as torch rounds it when the kernel is compiled
    with ``enable_fp_fusion=False`` (no FMA contraction; a correctly rounded division)."""
    inv_alpha = tl.math.div_rn(1.0, alpha + 1e-9)
    s = tl.sin(alpha * x)
    return x + inv_alpha * (s * s)


@triton.jit
def _snake_kernel(
    x_ptr,
    alpha_ptr,
    out_ptr,
    channels,
    length,
    stride_xb,
    stride_xc,
    stride_xt,
    stride_a,
    stride_ob,
    stride_oc,
    stride_ot,
    BLOCK_C: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    b = tl.program_id(2).to(tl.int64)
    c_ok = c < channels
    ok = c_ok[:, None] & (t[None, :] < length)
    c64 = c.to(tl.int64)[:, None]  # a long decode's (C, T) plane can pass 2**31 elements
    x = tl.load(x_ptr + b * stride_xb + c64 * stride_xc + t[None, :] * stride_xt, mask=ok, other=0.0)
    alpha = tl.load(alpha_ptr + c * stride_a, mask=c_ok, other=1.0).to(tl.float32)[:, None]
    y = snake_fp32(x.to(tl.float32), alpha)
    tl.store(
        out_ptr + b * stride_ob + c64 * stride_oc + t[None, :] * stride_ot, y.to(out_ptr.dtype.element_ty), mask=ok
    )


def snake(
    x: torch.Tensor, alpha: torch.Tensor, out_dtype: torch.dtype | None = None, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.snake.snake` (the reference it is tested against) for ``x``
    ``[B, C, T]`` of any strides and ``alpha`` of ``C`` elements.  Equal to it bit for bit when it computes
    in fp32 (fp16 or fp32 ``x``, fp32 ``alpha``); bf16 inputs with a bf16 ``alpha`` are rounded once here,
    after every op there.  float64 runs the reference."""
    if x.dtype == torch.float64 or alpha.dtype == torch.float64:
        return reference_snake(x, alpha, out_dtype, out=out)
    if x.dim() != 3 or alpha.numel() != x.shape[1]:
        raise ValueError(f"snake takes x [B, C, T] and C alphas; got {tuple(x.shape)} and {tuple(alpha.shape)}")
    if out is None:
        out = torch.empty(x.shape, dtype=out_dtype or torch.promote_types(x.dtype, alpha.dtype), device=x.device)
    elif out.shape != x.shape or out.device != x.device or (out_dtype is not None and out.dtype != out_dtype):
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} does not fit x {tuple(x.shape)} / {out_dtype}")
    batch, channels, length = x.shape
    if x.numel() == 0:
        return out
    block_t = min(triton.next_power_of_2(length), TILE)
    block_c = min(triton.next_power_of_2(channels), TILE // block_t)
    alpha = alpha.reshape(channels)
    grid = (triton.cdiv(length, block_t), triton.cdiv(channels, block_c), batch)
    _snake_kernel[grid](
        x,
        alpha,
        out,
        channels,
        length,
        *x.stride(),
        alpha.stride(0),
        *out.stride(),
        BLOCK_C=block_c,
        BLOCK_T=block_t,
        num_warps=4,
        enable_fp_fusion=False,  # torch rounds the product before the add
    )
    return out
