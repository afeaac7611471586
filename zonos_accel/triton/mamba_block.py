"""A Mamba2 block's decode step (``zonos.ops.mamba_block_step``) in three Triton kernels, for the few rows of a
batch-1..8 decode (up to 16 with CFG). The op-by-op path launches six to eight per block: add + LayerNorm,
``in_proj``, conv step, state update, gated RMSNorm, ``out_proj``, and cuBLAS's split-K reductions.

1. in_proj as a fused GEMV (:mod:`zonos_accel.triton.gemv`): the block's residual add and LayerNorm in its
   prologue, the conv step of its x, B and C channels in its epilogue; program 0 writes the new residual.
2. ``_ssm_gate_kernel``: per (``BLOCK_P`` channels of a head, head, row): that slice's state update from the
   convolved x, B and C, y, the gate y · SiLU(z) in float32 and the slice's sum of squares.
3. out_proj as a fused GEMV with the gated RMSNorm finished in its prologue: each program adds its rows' sums of
   squares in a fixed order (the norm's scale; equal inputs give equal bits) and applies it and the norm weight to
   the gated values as it reads them.

Rounded where the op-by-op path rounds (the residual sum, the normalized row, the projections, the conv outputs and
y to the activation dtype; the states to their own), so in float32 the codes equal that path's; sums run in other
orders. Float64 inputs compute in float64.
"""

from __future__ import annotations

import torch

from zonos.ops.mamba_step import step_tail_shapes
from zonos_accel.triton import gemv, pdl
from zonos_accel.triton._support import check_tensors, interpreting, tl, triton
from zonos_accel.triton.pdl import enter
from zonos_accel.triton.state_update import _softplus

MAX_ROWS = gemv.MAX_ROWS
BLOCK_P = 16  # channels of a head per state-update program, as zonos_accel/triton/state_update.py
STATE_WARPS = 4
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@triton.jit
def _ssm_gate_kernel(
    zx_ptr, ssm_ptr, A_ptr, D_ptr, dt_bias_ptr, gated_ptr, partial_ptr,
    p, n, d_inner, groups, heads_per_group,
    stride_zb, stride_sb, stride_sh, stride_sp, stride_sn,
    BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr, PROGRAMS: tl.constexpr, ACC: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    enter(GDC)
    pb = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // heads_per_group
    act = zx_ptr.dtype.element_ty
    rows = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    cols = tl.arange(0, BLOCK_S)
    row_ok = rows < p
    col_ok = cols < n
    row = zx_ptr + b * stride_zb  # [z | x B C (convolved) | dt] of this sequence
    ch = h * p + rows
    x = tl.load(row + d_inner + ch, mask=row_ok, other=0.0).to(ACC)
    Bv = tl.load(row + 2 * d_inner + g * n + cols, mask=col_ok, other=0.0).to(ACC)
    Cv = tl.load(row + 2 * d_inner + (groups + g) * n + cols, mask=col_ok, other=0.0).to(ACC)
    dt = _softplus(tl.load(row + 2 * d_inner + 2 * groups * n + h).to(ACC) + tl.load(dt_bias_ptr + h).to(ACC))
    decay = tl.exp(dt * tl.load(A_ptr + h).to(ACC))
    tile_ok = row_ok[:, None] & col_ok[None, :]
    state_ptrs = ssm_ptr + b * stride_sb + h * stride_sh + rows[:, None] * stride_sp + cols[None, :] * stride_sn
    state = tl.load(state_ptrs, mask=tile_ok, other=0.0).to(ACC)
    state = state * decay + (dt * x)[:, None] * Bv[None, :]
    tl.store(state_ptrs, state.to(ssm_ptr.dtype.element_ty), mask=tile_ok)
    y = tl.sum(state * Cv[None, :], axis=1) + x * tl.load(D_ptr + h).to(ACC)
    y = y.to(act).to(ACC)
    zv = tl.load(row + ch, mask=row_ok, other=0.0).to(ACC)
    gated = tl.where(row_ok, y * (zv * tl.sigmoid(zv)), 0.0)
    tl.store(gated_ptr + b * d_inner + ch, gated, mask=row_ok)
    j = (h % heads_per_group) * tl.num_programs(0) + pb  # this program's place in its group
    tl.store(partial_ptr + (b * groups + g) * PROGRAMS + j, tl.sum(gated * gated, axis=0))


def fits(
    hidden: torch.Tensor, residual, norm_weight, norm_bias, norm_eps, in_weight: torch.Tensor, conv_state, conv_weight,
    conv_bias, ssm_state: torch.Tensor, A, D, dt_bias, gate_weight, gate_eps, out_weight,
) -> bool:  # fmt: skip
    """Whether :func:`mamba_block_step` serves this call (its arguments): up to :data:`MAX_ROWS` rows of a float
    dtype, d_model and d_inner up to :data:`gemv.MAX_K`, on a CUDA device (or the CPU under Triton's interpreter); the
    backend composes the op of its parts for the rest."""
    on_device = hidden.is_cuda or (interpreting() and hidden.device.type == "cpu")
    short = max(hidden.shape[-1], ssm_state.shape[1] * ssm_state.shape[2]) <= gemv.MAX_K
    return on_device and short and 0 < hidden.shape[0] <= MAX_ROWS and hidden.dtype in _DTYPES


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`zonos.ops.mamba_step.mamba_block_step` (the composition it is tested against), for
    the calls :func:`fits` accepts."""
    check_tensors("mamba_block_step", hidden=hidden, residual=residual, norm_weight=norm_weight, norm_bias=norm_bias,
                  in_weight=in_weight, conv_state=conv_state, conv_weight=conv_weight, conv_bias=conv_bias,
                  ssm_state=ssm_state, A=A, D=D, dt_bias=dt_bias, gate_weight=gate_weight,
                  out_weight=out_weight)  # fmt: skip
    b, d = hidden.shape
    h, p, n, groups, d_inner = step_tail_shapes(conv_state, ssm_state)
    conv_dim = conv_state.shape[1]
    n_in = d_inner + conv_dim + h
    if b > MAX_ROWS:
        raise ValueError(f"mamba_block_step's fused kernels take at most {MAX_ROWS} rows, got {b}")
    if residual is not None and residual.shape != (b, d):
        raise ValueError(f"mamba_block_step: residual {tuple(residual.shape)} does not match hidden {(b, d)}")
    if in_weight.shape != (n_in, d) or out_weight.shape[1] != d_inner or conv_state.shape[0] != b:
        raise ValueError(
            f"mamba_block_step takes in_weight ({n_in}, {d}), out_weight (d, {d_inner}) and caches of {b} rows; got "
            f"{tuple(in_weight.shape)}, {tuple(out_weight.shape)}, {conv_state.shape[0]}"
        )
    hidden = hidden.contiguous()
    residual = None if residual is None else residual.contiguous()
    norm_weight, in_weight, out_weight, gate_weight = (
        t.contiguous() for t in (norm_weight, in_weight, out_weight, gate_weight)
    )
    A, D, dt_bias = (t.contiguous() for t in (A, D, dt_bias))
    cdt = gemv.acc_dtype(hidden.dtype)
    device = hidden.device

    zx, total = gemv.gemv(
        hidden, in_weight, prologue=gemv.LAYER_NORM, residual=residual, norm_weight=norm_weight, norm_bias=norm_bias,
        eps=norm_eps, epilogue=gemv.CONV, conv=(conv_state, conv_weight, conv_bias, d_inner),
    )  # fmt: skip
    tiles = triton.cdiv(p, BLOCK_P)
    programs = tiles * (h // groups)
    gated = torch.empty(b, d_inner, device=device, dtype=cdt)
    stats = torch.empty(b, groups, programs, device=device, dtype=cdt)
    _ssm_gate_kernel[(tiles, h, b)](
        zx, ssm_state, A, D, dt_bias, gated, stats,
        p, n, d_inner, groups, h // groups, zx.stride(0), *ssm_state.stride(),
        BLOCK_P=BLOCK_P, BLOCK_S=triton.next_power_of_2(n), PROGRAMS=programs,
        ACC=tl.float64 if cdt == torch.float64 else tl.float32, num_warps=STATE_WARPS, **pdl.options(device),
    )  # fmt: skip
    out, _ = gemv.gemv(
        gated, out_weight, prologue=gemv.GATED_RMS, norm_weight=gate_weight, eps=gate_eps, stats=stats,
        group_size=d_inner // groups, out_dtype=zx.dtype,
    )  # fmt: skip
    return out, total
