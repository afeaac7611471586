"""A Mamba2 block's decode step (``zonos.ops.mamba_block_step``) in three Triton kernels, for the few rows of a
batch-1..8 decode (up to 16 with CFG). The op-by-op path launches six to eight per block: add + LayerNorm,
``in_proj``, conv step, state update, gated RMSNorm, ``out_proj``, and cuBLAS's split-K reductions.

1. ``_norm_in_proj_kernel``: a program owns ``BLOCK_N`` output channels of ``in_proj`` and their whole
   reduction. It loads its weight tile (``BLOCK_N`` × d_model) before it waits for the kernel before it (under PDL;
   the weights do not depend on that kernel), then per row adds the residual, normalizes the row itself (every
   program does: a row is 4 KB, read from L2) and multiplies. Its x, B and C channels take the conv step in the
   epilogue: a channel's conv state belongs to the one program that computes the channel, so shifting it needs no
   ordering between programs. Program 0 writes the new residual.
2. ``_ssm_gate_kernel``: per (``BLOCK_P`` channels of a head, head, row): that slice's state update from the
   convolved x, B and C, y, the gate y · SiLU(z) in float32 and the slice's sum of squares.
3. ``_norm_out_proj_kernel``: ``out_proj`` with the gated RMSNorm finished in its prologue: each program adds its
   rows' sums of squares in a fixed order (the norm's scale; equal inputs give equal bits) and applies it and the
   norm weight to the gated values as it reads them.

Rounded where the op-by-op path rounds (the residual sum, the normalized row, the projections, the conv outputs and
y to the activation dtype; the states to their own), so in float32 the codes equal that path's; sums run in other
orders. Float64 inputs compute in float64.
"""

from __future__ import annotations

import torch

from zonos.ops.mamba_step import step_tail_shapes
from zonos_accel.triton import pdl
from zonos_accel.triton._support import check_tensors, interpreting, tl, triton
from zonos_accel.triton.pdl import enter
from zonos_accel.triton.state_update import _softplus

MAX_ROWS = 16  # rows (batch × CFG) the fused step serves; larger batches run the op-by-op path (GEMMs)
# Weight elements per GEMV program (its whole tile is loaded at once, so the loads are all in flight together):
# 8 output channels of in_proj (d_model 2048), 4 of out_proj (d_inner 4096). Not yet timed on a GPU.
TILE_ELEMENTS = 16384
GEMV_WARPS = 8
BLOCK_P = 16  # channels of a head per state-update program, as zonos_accel/triton/state_update.py
STATE_WARPS = 4
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@triton.jit
def _norm_in_proj_kernel(
    h_ptr, r_ptr, lnw_ptr, lnb_ptr, w_ptr, out_ptr, sum_ptr, conv_ptr, cw_ptr, cb_ptr,
    N, K, conv_lo, conv_hi, eps,
    stride_h, stride_r, stride_w, stride_o, stride_s, stride_cb, stride_cc, stride_ck, stride_wc, stride_wk,
    M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_NORM_BIAS: tl.constexpr, KC: tl.constexpr, KCP: tl.constexpr, HAS_CONV_BIAS: tl.constexpr,
    ACC: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    n_ok = n < N
    k_ok = k < K
    w = tl.load(w_ptr + n[:, None] * stride_w + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    enter(GDC)  # everything below reads what the kernels before wrote
    act = out_ptr.dtype.element_ty
    lnw = tl.load(lnw_ptr + k, mask=k_ok, other=0.0).to(ACC)
    if HAS_NORM_BIAS:
        lnb = tl.load(lnb_ptr + k, mask=k_ok, other=0.0).to(ACC)
    # This tile's conv channels (x, B and C: in_proj outputs conv_lo .. conv_hi); none in most tiles, whose masked
    # loads and stores touch no memory.
    ch = n - conv_lo
    conv_ok = n_ok & (n >= conv_lo) & (n < conv_hi)
    kk = tl.arange(0, KCP)
    taps_ok = conv_ok[:, None] & (kk[None, :] < KC)
    cw = tl.load(cw_ptr + ch[:, None] * stride_wc + kk[None, :] * stride_wk, mask=taps_ok, other=0.0).to(ACC)
    if HAS_CONV_BIAS:
        cb = tl.load(cb_ptr + ch, mask=conv_ok, other=0.0).to(ACC)
    for m in tl.static_range(M):
        x = tl.load(h_ptr + m * stride_h + k, mask=k_ok, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(r_ptr + m * stride_r + k, mask=k_ok, other=0.0)
            x = (x.to(ACC) + r.to(ACC)).to(sum_ptr.dtype.element_ty)  # rounded like a torch add
            if pid == 0:
                tl.store(sum_ptr + m * stride_s + k, x, mask=k_ok)
        xf = x.to(ACC)
        mean = tl.sum(xf, axis=0) / K
        centered = tl.where(k_ok, xf - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / K + eps)
        y = centered * rstd * lnw
        if HAS_NORM_BIAS:
            y += lnb
        y = y.to(act).to(ACC)  # the normalized row in the activation dtype, as the op-by-op path hands in_proj
        v = tl.sum(w.to(ACC) * y[None, :], axis=1).to(act)
        # The conv step of this row's conv channels: shift in the projection, conv, bias, SiLU.
        state = conv_ptr + m * stride_cb + ch[:, None] * stride_cc
        shifted_ok = conv_ok[:, None] & (kk[None, :] + 1 < KC)
        older = tl.load(state + (kk[None, :] + 1) * stride_ck, mask=shifted_ok, other=0.0)
        window = tl.where(kk[None, :] == KC - 1, v.to(conv_ptr.dtype.element_ty)[:, None], older)
        c = tl.sum(window.to(ACC) * cw, axis=1)
        if HAS_CONV_BIAS:
            c += cb
        c = c * tl.sigmoid(c)
        tl.debug_barrier()  # every read of the old conv state precedes the write of the shifted one
        tl.store(state + kk[None, :] * stride_ck, window, mask=taps_ok)
        tl.store(out_ptr + m * stride_o + n, tl.where(conv_ok, c.to(act), v), mask=n_ok)


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


@triton.jit
def _norm_out_proj_kernel(
    gated_ptr, partial_ptr, nw_ptr, w_ptr, out_ptr,
    N, K, group_size, eps, stride_w, stride_o,
    M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr, PROGRAMS: tl.constexpr,
    PROGRAMS_P2: tl.constexpr, ACC: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    n_ok = n < N
    k_ok = k < K
    w = tl.load(w_ptr + n[:, None] * stride_w + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    enter(GDC)
    act = out_ptr.dtype.element_ty
    nw = tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(ACC)
    j = tl.arange(0, PROGRAMS_P2)
    group = k // group_size
    for m in tl.static_range(M):
        v = tl.load(gated_ptr + m * K + k, mask=k_ok, other=0.0)
        scale = tl.zeros([BLOCK_K], dtype=ACC)
        for g in tl.static_range(GROUPS):
            partials = tl.load(partial_ptr + (m * GROUPS + g) * PROGRAMS + j, mask=j < PROGRAMS, other=0.0)
            scale = tl.where(group == g, 1.0 / tl.sqrt(tl.sum(partials, axis=0) / group_size + eps), scale)
        x = (v * scale * nw).to(act).to(ACC)  # the gated norm's output, rounded as it is handed to out_proj
        tl.store(out_ptr + m * stride_o + n, tl.sum(w.to(ACC) * x[None, :], axis=1).to(act), mask=n_ok)


def fits(hidden: torch.Tensor, *rest, **named) -> bool:
    """Whether :func:`mamba_block_step` serves this call: up to :data:`MAX_ROWS` rows of a float dtype on a CUDA
    device (or the CPU under Triton's interpreter); the backend composes the op of its parts for the rest."""
    on_device = hidden.is_cuda or (interpreting() and hidden.device.type == "cpu")
    return on_device and 0 < hidden.shape[0] <= MAX_ROWS and hidden.dtype in _DTYPES


def _block_n(k: int) -> int:
    return max(2, min(64, TILE_ELEMENTS // triton.next_power_of_2(k)))


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
    conv_dim, kc = conv_state.shape[1:]
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
    acc_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    acc = tl.float64 if acc_dtype == torch.float64 else tl.float32
    device = hidden.device
    launch = pdl.options(device)

    zx = torch.empty(b, n_in, device=device, dtype=hidden.dtype)
    total = hidden
    if residual is not None:
        total = torch.empty(b, d, device=device, dtype=torch.promote_types(hidden.dtype, residual.dtype))
    block_n = _block_n(d)
    _norm_in_proj_kernel[(triton.cdiv(n_in, block_n),)](
        hidden, residual if residual is not None else hidden, norm_weight,
        norm_bias if norm_bias is not None else norm_weight, in_weight, zx, total, conv_state, conv_weight,
        conv_bias if conv_bias is not None else conv_weight,
        n_in, d, d_inner, d_inner + conv_dim, norm_eps,
        hidden.stride(0), residual.stride(0) if residual is not None else 0, in_weight.stride(0), zx.stride(0),
        total.stride(0), *conv_state.stride(), conv_weight.stride(0), conv_weight.stride(2),
        M=b, BLOCK_N=block_n, BLOCK_K=triton.next_power_of_2(d), HAS_RESIDUAL=residual is not None,
        HAS_NORM_BIAS=norm_bias is not None, KC=kc, KCP=triton.next_power_of_2(kc),
        HAS_CONV_BIAS=conv_bias is not None, ACC=acc, num_warps=GEMV_WARPS, **launch,
    )  # fmt: skip

    tiles = triton.cdiv(p, BLOCK_P)
    programs = tiles * (h // groups)
    gated = torch.empty(b, d_inner, device=device, dtype=acc_dtype)
    partial = torch.empty(b, groups, programs, device=device, dtype=acc_dtype)
    _ssm_gate_kernel[(tiles, h, b)](
        zx, ssm_state, A, D, dt_bias, gated, partial,
        p, n, d_inner, groups, h // groups, zx.stride(0), *ssm_state.stride(),
        BLOCK_P=BLOCK_P, BLOCK_S=triton.next_power_of_2(n), PROGRAMS=programs, ACC=acc, num_warps=STATE_WARPS,
        **launch,
    )  # fmt: skip

    n_out = out_weight.shape[0]
    out = torch.empty(b, n_out, device=device, dtype=hidden.dtype)
    block_n = _block_n(d_inner)
    _norm_out_proj_kernel[(triton.cdiv(n_out, block_n),)](
        gated, partial, gate_weight, out_weight, out,
        n_out, d_inner, d_inner // groups, gate_eps, out_weight.stride(0), out.stride(0),
        M=b, BLOCK_N=block_n, BLOCK_K=triton.next_power_of_2(d_inner), GROUPS=groups, PROGRAMS=programs,
        PROGRAMS_P2=triton.next_power_of_2(programs), ACC=acc, num_warps=GEMV_WARPS, **launch,
    )  # fmt: skip
    return out, total
