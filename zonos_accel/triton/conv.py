"""One-token depthwise causal conv (``zonos.ops.conv_step``) as one Triton kernel.

The reference shifts the (b, c, k) conv state left with a cat and a copy, then upcasts, multiplies,
sums, adds the bias and applies SiLU: about ten launches per Mamba2 layer. Here one program owns a
block of channels of one sequence: it reads the k - 1 newest state columns and the new input, writes
the shifted state back, and writes SiLU(conv) in the input's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zonos_accel.triton import pdl
from zonos_accel.triton.pdl import enter

BLOCK_C = 256  # channels per program; conv_dim 4352 at Zonos-v0.1-hybrid size gives 17 × batch programs


@triton.jit
def conv_window(state_row, x_row, ch, ch_ok, stride_sk, K: tl.constexpr, KP: tl.constexpr):
    """The conv state of channels ``ch`` after one step, as (channels, KP) in the state's dtype: column j is old
    column j + 1, the last column the new input (``state_row``: the channels' rows, ``x_row``: the input row)."""
    k = tl.arange(0, KP)
    older = tl.load(state_row + (k[None, :] + 1) * stride_sk, mask=ch_ok[:, None] & (k[None, :] + 1 < K), other=0.0)
    newest = tl.load(x_row + ch, mask=ch_ok, other=0.0).to(state_row.dtype.element_ty)
    return tl.where(k[None, :] == K - 1, newest[:, None], older)


@triton.jit
def conv_silu(window, w_ptr, bias_ptr, ch, ch_ok, stride_wc, stride_wk, K: tl.constexpr, KP: tl.constexpr,
              HAS_BIAS: tl.constexpr):  # fmt: skip
    """SiLU(causal conv) of channels ``ch`` over their ``window`` (:func:`conv_window`), in float32."""
    k = tl.arange(0, KP)
    w = tl.load(w_ptr + ch[:, None] * stride_wc + k[None, :] * stride_wk, mask=ch_ok[:, None] & (k[None, :] < K),
                other=0.0)  # fmt: skip
    acc = tl.sum(window.to(tl.float32) * w.to(tl.float32), axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
    return acc * tl.sigmoid(acc)


@triton.jit
def _conv_step_kernel(
    state_ptr,
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    channels,
    stride_sb,
    stride_sc,
    stride_sk,
    stride_xb,
    stride_wc,
    stride_wk,
    stride_yb,
    K: tl.constexpr,
    KP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
    GDC: tl.constexpr,
):
    enter(GDC)
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    k = tl.arange(0, KP)
    c_ok = c < channels
    state_row = state_ptr + b * stride_sb + c[:, None] * stride_sc
    window = conv_window(state_row, x_ptr + b * stride_xb, c, c_ok, stride_sk, K, KP)
    y = conv_silu(window, w_ptr, bias_ptr, c, c_ok, stride_wc, stride_wk, K, KP, HAS_BIAS)
    tl.debug_barrier()  # every read of the old state precedes any write of the shifted one
    tl.store(state_row + k[None, :] * stride_sk, window, mask=c_ok[:, None] & (k[None, :] < K))
    tl.store(y_ptr + b * stride_yb + c, y.to(y_ptr.dtype.element_ty), mask=c_ok)


def conv_step(
    conv_state: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.conv.conv_step` (the reference it is tested against)."""
    b, c, k = conv_state.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(b, c, device=x.device, dtype=x.dtype)
    _conv_step_kernel[(b, triton.cdiv(c, BLOCK_C))](
        conv_state,
        x,
        weight,
        bias if bias is not None else weight,
        y,
        c,
        conv_state.stride(0),
        conv_state.stride(1),
        conv_state.stride(2),
        x.stride(0),
        weight.stride(0),
        weight.stride(2),
        y.stride(0),
        K=k,
        KP=triton.next_power_of_2(k),
        HAS_BIAS=bias is not None,
        BLOCK=BLOCK_C,
        **pdl.options(x.device),
    )
    return y
