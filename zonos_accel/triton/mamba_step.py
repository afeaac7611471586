"""The Mamba2 decode step between its projections (``zonos.ops.mamba_step_tail``) as one Triton kernel, where the
op-by-op path launches three (conv step, state update, gated RMSNorm).

One program owns ``BLOCK_P`` channels of one head of one sequence, as the state update does (4 · 64 programs per
sequence at Zonos-v0.1-hybrid size). It runs the conv step for its x channels (and writes their shifted conv
state) and for its group's B and C (each program of the group computes them; none writes their state yet), updates
its slice of the SSM state, and writes y · SiLU(z) in float32 with its sum of squares. The group's gated RMSNorm
needs every program's sum: each program then takes a ticket (an atomic add on a per-(sequence, group) counter,
released after its writes), and the program that draws the last one adds the sums in a fixed order (so results do
not depend on which program finished first), normalizes the group's channels, and shifts the B and C conv state,
which every other program of the group has read by then. It also sets the counter back to zero, so counters that
live in the decode cache (``Mamba2Cache.tickets``) serve every step without a memset; without them each call
zeroes new ones.

Rounded as the op-by-op path rounds: the conv output and y to the activation dtype, the state to its own.
"""

from __future__ import annotations

import torch

from zonos.ops.mamba_step import step_tail_shapes
from zonos_accel.triton import pdl
from zonos_accel.triton._support import check_tensors, tl, triton
from zonos_accel.triton.conv import conv_silu, conv_window
from zonos_accel.triton.pdl import enter
from zonos_accel.triton.state_update import _softplus

BLOCK_P = 16  # channels per program, the state update's (zonos_accel/triton/state_update.py)
NUM_WARPS = 4
NORM_BLOCK = 1024  # channels per loop step of the last program's normalization
MAX_BATCH = 65535  # the grid's third axis


@triton.jit
def _step_tail_kernel(
    conv_ptr, xbc_ptr, cw_ptr, cb_ptr, ssm_ptr, dt_ptr, A_ptr, D_ptr, dt_bias_ptr, z_ptr, nw_ptr,
    gated_ptr, partial_ptr, ticket_ptr, out_ptr,
    p, n, d_inner, heads_per_group, groups, group_size, eps,
    stride_cb, stride_cc, stride_ck, stride_xb, stride_wc, stride_wk,
    stride_sb, stride_sh, stride_sp, stride_sn, stride_dtb, stride_zb, stride_ob,
    K: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr, PROGRAMS: tl.constexpr, PROGRAMS_P2: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, NORM_BLOCK: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    enter(GDC)
    pb = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // heads_per_group
    dtype = xbc_ptr.dtype.element_ty
    rows = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < p
    col_ok = cols < n
    conv_row = conv_ptr + b * stride_cb
    x_in = xbc_ptr + b * stride_xb

    # x: this program's channels of head h (it alone reads and writes their conv state).
    xc = h * p + rows
    x_rows = conv_row + xc[:, None] * stride_cc
    x_window = conv_window(x_rows, x_in, xc, row_ok, stride_ck, K, KP)
    x = conv_silu(x_window, cw_ptr, cb_ptr, xc, row_ok, stride_wc, stride_wk, K, KP, HAS_BIAS).to(dtype).to(tl.float32)
    # B and C of group g: every program of the group computes them from the old state; the last one stores it.
    bc = d_inner + g * n + cols
    cc = d_inner + groups * n + g * n + cols
    B_rows = conv_row + bc[:, None] * stride_cc
    C_rows = conv_row + cc[:, None] * stride_cc
    B_window = conv_window(B_rows, x_in, bc, col_ok, stride_ck, K, KP)
    C_window = conv_window(C_rows, x_in, cc, col_ok, stride_ck, K, KP)
    Bv = conv_silu(B_window, cw_ptr, cb_ptr, bc, col_ok, stride_wc, stride_wk, K, KP, HAS_BIAS)
    Cv = conv_silu(C_window, cw_ptr, cb_ptr, cc, col_ok, stride_wc, stride_wk, K, KP, HAS_BIAS)
    Bv, Cv = Bv.to(dtype).to(tl.float32), Cv.to(dtype).to(tl.float32)
    tl.debug_barrier()  # every read of the old x state precedes any write of the shifted one
    kk = tl.arange(0, KP)
    tl.store(x_rows + kk[None, :] * stride_ck, x_window, mask=row_ok[:, None] & (kk[None, :] < K))

    # The SSD step of this slice of the state.
    dt = _softplus(tl.load(dt_ptr + b * stride_dtb + h).to(tl.float32) + tl.load(dt_bias_ptr + h).to(tl.float32))
    decay = tl.exp(dt * tl.load(A_ptr + h).to(tl.float32))
    tile_ok = row_ok[:, None] & col_ok[None, :]
    state_ptrs = ssm_ptr + b * stride_sb + h * stride_sh + rows[:, None] * stride_sp + cols[None, :] * stride_sn
    state = tl.load(state_ptrs, mask=tile_ok, other=0.0).to(tl.float32)
    state = state * decay + (dt * x)[:, None] * Bv[None, :]
    tl.store(state_ptrs, state.to(ssm_ptr.dtype.element_ty), mask=tile_ok)
    y = tl.sum(state * Cv[None, :], axis=1) + x * tl.load(D_ptr + h).to(tl.float32)
    y = y.to(dtype).to(tl.float32)

    # Gate, and this program's share of the group's sum of squares.
    zv = tl.load(z_ptr + b * stride_zb + xc, mask=row_ok, other=0.0).to(tl.float32)
    gated = tl.where(row_ok, y * (zv * tl.sigmoid(zv)), 0.0)
    tl.store(gated_ptr + b * d_inner + xc, gated, mask=row_ok)
    j = (h % heads_per_group) * tl.num_programs(0) + pb  # this program's place in its group
    cell = b * groups + g
    tl.store(partial_ptr + cell * PROGRAMS + j, tl.sum(gated * gated, axis=0))
    tl.debug_barrier()  # the whole program's writes precede its ticket (released with it)
    ticket = tl.atomic_add(ticket_ptr + cell, 1, sem="acq_rel")
    if ticket == PROGRAMS - 1:  # the last of its group: every other program's writes are visible
        tl.store(ticket_ptr + cell, 0)  # every program of the group has counted: ready for the next call
        idx = tl.arange(0, PROGRAMS_P2)
        partials = tl.load(partial_ptr + cell * PROGRAMS + idx, mask=idx < PROGRAMS, other=0.0, cache_modifier=".cg")
        total = tl.sum(partials, axis=0)
        scale = tl.rsqrt(total / group_size + eps)
        for start in range(0, group_size, NORM_BLOCK):
            c = g * group_size + start + tl.arange(0, NORM_BLOCK)
            c_ok = c < (g + 1) * group_size
            v = tl.load(gated_ptr + b * d_inner + c, mask=c_ok, other=0.0, cache_modifier=".cg")
            wv = tl.load(nw_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
            tl.store(out_ptr + b * stride_ob + c, (v * scale * wv).to(out_ptr.dtype.element_ty), mask=c_ok)
        # B and C's conv state: all of the group's programs have read the old one.
        bc_ok = col_ok[:, None] & (kk[None, :] < K)
        tl.store(B_rows + kk[None, :] * stride_ck, B_window, mask=bc_ok)
        tl.store(C_rows + kk[None, :] * stride_ck, C_window, mask=bc_ok)


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
    """Same contract as :func:`zonos.ops.mamba_step.mamba_step_tail` (the composition it is tested against);
    ``tickets`` (b, groups) int32 zeros, contiguous, are counted with and left zero (None: new ones per call)."""
    b, conv_dim, k = conv_state.shape
    h, p, n, groups, d_inner = step_tail_shapes(conv_state, ssm_state)
    check_tensors("mamba_step_tail", conv_state=conv_state, xbc=xbc, conv_weight=conv_weight, conv_bias=conv_bias,
                  ssm_state=ssm_state, dt=dt, A=A, D=D, dt_bias=dt_bias, z=z, norm_weight=norm_weight,
                  tickets=tickets)  # fmt: skip
    if xbc.shape != (b, conv_dim) or dt.shape != (b, h) or z.shape != (b, d_inner) or norm_weight.shape != (d_inner,):
        raise ValueError(
            f"mamba_step_tail takes xbc (b, {conv_dim}), dt (b, {h}), z (b, {d_inner}) and norm_weight ({d_inner},); "
            f"got {tuple(xbc.shape)}, {tuple(dt.shape)}, {tuple(z.shape)}, {tuple(norm_weight.shape)}"
        )
    if b > MAX_BATCH:
        raise ValueError(f"mamba_step_tail runs at most {MAX_BATCH} sequences per launch, got {b}")
    if xbc.stride(-1) != 1 or z.stride(-1) != 1 or dt.stride(-1) != 1:
        xbc, z, dt = xbc.contiguous(), z.contiguous(), dt.contiguous()
    A, D, dt_bias, norm_weight = (t.contiguous() for t in (A, D, dt_bias, norm_weight))
    out = torch.empty(b, d_inner, device=xbc.device, dtype=xbc.dtype)
    if b == 0:
        return out
    tiles = triton.cdiv(p, BLOCK_P)
    programs = tiles * (h // groups)
    gated = torch.empty(b, d_inner, device=xbc.device, dtype=torch.float32)
    partial = torch.empty(b, groups, programs, device=xbc.device, dtype=torch.float32)
    if tickets is None:
        tickets = torch.zeros(b, groups, device=xbc.device, dtype=torch.int32)
    elif tickets.shape != (b, groups) or tickets.dtype != torch.int32 or not tickets.is_contiguous():
        raise ValueError(
            f"mamba_step_tail's tickets must be contiguous int32 zeros of shape ({b}, {groups}), got "
            f"{tickets.dtype} {tuple(tickets.shape)}"
        )
    _step_tail_kernel[(tiles, h, b)](
        conv_state, xbc, conv_weight, conv_bias if conv_bias is not None else conv_weight, ssm_state, dt, A, D,
        dt_bias, z, norm_weight, gated, partial, tickets, out,
        p, n, d_inner, h // groups, groups, d_inner // groups, eps,
        *conv_state.stride(), xbc.stride(0), conv_weight.stride(0), conv_weight.stride(2),
        *ssm_state.stride(), dt.stride(0), z.stride(0), out.stride(0),
        K=k, KP=triton.next_power_of_2(k), HAS_BIAS=conv_bias is not None, PROGRAMS=programs,
        PROGRAMS_P2=triton.next_power_of_2(programs),
        BLOCK_P=BLOCK_P, BLOCK_N=triton.next_power_of_2(n), NORM_BLOCK=NORM_BLOCK, num_warps=NUM_WARPS,
        **pdl.options(xbc.device),
    )  # fmt: skip
    return out
