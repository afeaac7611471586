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

With :data:`SSM_IN_PROJ`, 1 and 2 are one launch (``_in_proj_ssm_kernel``): the tile that completes a head's inputs
updates that head, counting with the decode cache's counters.

Rounded where the op-by-op path rounds (the residual sum, the normalized row, the projections, the conv outputs and
y to the activation dtype; the states to their own), so in float32 the codes equal that path's; sums run in other
orders. Float64 inputs compute in float64.
"""

from __future__ import annotations

import torch

from zonos.ops.mamba_step import step_tail_shapes
from zonos_accel.triton import gemv, pdl
from zonos_accel.triton._support import check_tensors, tl, triton
from zonos_accel.triton.gemv import K_CONV, K_LAYER_NORM, gemv_tile
from zonos_accel.triton.pdl import enter
from zonos_accel.triton.state_update import _softplus

MAX_ROWS = gemv.MAX_ROWS
# The state update inside in_proj's launch (two launches per block): each tile counts itself into the heads it feeds,
# and the tile that completes a head's inputs updates that head. Off: a launch of its own (three per block). Not yet
# timed against each other on a GPU (benchmarks/mamba_decode_ops.py --parts block).
SSM_IN_PROJ = False
BLOCK_P = 16  # channels of a head per state-update program, as zonos_accel/triton/state_update.py
STATE_WARPS = 4


@triton.jit
def _ssm_slice(zx_row, state_row, A_ptr, D_ptr, dt_bias_ptr, gated_row, h, g, rows, cols, row_ok, col_ok, p, n,
               d_inner, groups, stride_sh, stride_sp, stride_sn, ACC: tl.constexpr):  # fmt: skip
    """Channels ``rows`` of head ``h`` of one sequence (its [z | x B C (convolved) | dt] row ``zx_row``, its state
    ``state_row``): the state update, y, the gate y · SiLU(z) (stored in float32 at ``gated_row``); returns the
    slice's sum of squares. The row's values may come from other programs of this launch: loaded from L2 (.cg)."""
    act = zx_row.dtype.element_ty
    ch = h * p + rows
    x = tl.load(zx_row + d_inner + ch, mask=row_ok, other=0.0, cache_modifier=".cg").to(ACC)
    Bv = tl.load(zx_row + 2 * d_inner + g * n + cols, mask=col_ok, other=0.0, cache_modifier=".cg").to(ACC)
    Cv = tl.load(zx_row + 2 * d_inner + (groups + g) * n + cols, mask=col_ok, other=0.0, cache_modifier=".cg")
    raw_dt = tl.load(zx_row + 2 * d_inner + 2 * groups * n + h, cache_modifier=".cg").to(ACC)
    dt = _softplus(raw_dt + tl.load(dt_bias_ptr + h).to(ACC))
    decay = tl.exp(dt * tl.load(A_ptr + h).to(ACC))
    tile_ok = row_ok[:, None] & col_ok[None, :]
    state_ptrs = state_row + h * stride_sh + rows[:, None] * stride_sp + cols[None, :] * stride_sn
    state = tl.load(state_ptrs, mask=tile_ok, other=0.0).to(ACC)
    state = state * decay + (dt * x)[:, None] * Bv[None, :]
    tl.store(state_ptrs, state.to(state_row.dtype.element_ty), mask=tile_ok)
    y = tl.sum(state * Cv.to(ACC)[None, :], axis=1) + x * tl.load(D_ptr + h).to(ACC)
    y = y.to(act).to(ACC)
    zv = tl.load(zx_row + ch, mask=row_ok, other=0.0, cache_modifier=".cg").to(ACC)
    gated = tl.where(row_ok, y * (zv * tl.sigmoid(zv)), 0.0)
    tl.store(gated_row + ch, gated, mask=row_ok)
    return tl.sum(gated * gated, axis=0)


@triton.jit
def _ssm_gate_kernel(
    zx_ptr, ssm_ptr, A_ptr, D_ptr, dt_bias_ptr, gated_ptr, stats_ptr,
    p, n, d_inner, groups, heads_per_group,
    stride_zb, stride_sb, stride_sh, stride_sp, stride_sn,
    BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr, PROGRAMS: tl.constexpr, ACC: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    enter(GDC)
    pb = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // heads_per_group
    rows = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    cols = tl.arange(0, BLOCK_S)
    sumsq = _ssm_slice(zx_ptr + b * stride_zb, ssm_ptr + b * stride_sb, A_ptr, D_ptr, dt_bias_ptr,
                       gated_ptr + b * d_inner, h, g, rows, cols, rows < p, cols < n, p, n, d_inner, groups,
                       stride_sh, stride_sp, stride_sn, ACC)  # fmt: skip
    j = (h % heads_per_group) * tl.num_programs(0) + pb  # this program's place in its group
    tl.store(stats_ptr + (b * groups + g) * PROGRAMS + j, sumsq)


@triton.jit
def _in_proj_ssm_kernel(
    x_ptr, r_ptr, nw_ptr, nb_ptr, w_ptr, zx_ptr, sum_ptr, conv_ptr, cw_ptr, cb_ptr,
    ssm_ptr, A_ptr, D_ptr, dt_bias_ptr, gated_ptr, stats_ptr, count_ptr,
    N, K, eps, d_inner, conv_dim, p, n, groups, heads, heads_per_group,
    stride_x, stride_r, stride_w, stride_o, stride_s, stride_cb, stride_cc, stride_ck, stride_wc, stride_wk,
    stride_sb, stride_sh, stride_sp, stride_sn,
    M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_NORM_BIAS: tl.constexpr, KC: tl.constexpr, KCP: tl.constexpr, HAS_CONV_BIAS: tl.constexpr,
    BC_TILES: tl.constexpr, SHARED_TILES: tl.constexpr, HEAD_TILES: tl.constexpr, TARGET: tl.constexpr,
    SSM_P: tl.constexpr, BLOCK_S: tl.constexpr, ACC: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    # Tiles in dispatch order: B and C, then dt (every head needs them), then each head's z and x tiles, so a head's
    # inputs are complete about when its own tiles finish and the state updates spread over the launch.
    if pid < BC_TILES:
        n0 = 2 * d_inner + pid * BLOCK_N
        first = ((n0 - 2 * d_inner) // n) % groups * heads_per_group  # a B or C tile feeds its group's heads
        last = first + heads_per_group
    elif pid < SHARED_TILES:
        n0 = 2 * d_inner + 2 * groups * n + (pid - BC_TILES) * BLOCK_N
        first = n0 - 2 * d_inner - 2 * groups * n  # a dt tile feeds the heads it holds
        last = tl.minimum(first + BLOCK_N, heads)
    else:
        first = (pid - SHARED_TILES) // HEAD_TILES
        last = first + 1
        t = (pid - SHARED_TILES) % HEAD_TILES
        n0 = first * p + (t % (HEAD_TILES // 2)) * BLOCK_N + (t // (HEAD_TILES // 2)) * d_inner  # z, then x
    gemv_tile(
        n0, pid == 0, x_ptr, r_ptr, nw_ptr, nb_ptr, nw_ptr, w_ptr, w_ptr, zx_ptr, sum_ptr, conv_ptr, cw_ptr, cb_ptr,
        N, K, d_inner, d_inner + conv_dim, eps, 1, stride_x, stride_r, stride_w, stride_o, stride_s, stride_cb,
        stride_cc, stride_ck, stride_wc, stride_wk, M, BLOCK_N, BLOCK_K, K_LAYER_NORM, K_CONV, HAS_RESIDUAL,
        HAS_NORM_BIAS, False, 1, 1, 1, KC, KCP, HAS_CONV_BIAS, ACC, GDC,
    )  # fmt: skip
    tl.debug_barrier()  # the tile's stores precede its counts (released with them)
    cols = tl.arange(0, BLOCK_S)
    for head in range(first, last):
        if tl.atomic_add(count_ptr + head, 1, sem="acq_rel") == TARGET - 1:  # the head's last input: update it
            tl.store(count_ptr + head, 0)  # every tile has counted: ready for the next call
            g = head // heads_per_group
            for m in range(M):  # a loop, not unrolled: this runs once a head, off the GEMV's path
                sumsq = tl.sum(tl.zeros([SSM_P], dtype=ACC), axis=0)
                for p0 in range(0, p, SSM_P):  # blocks of the head's channels, as the three-launch kernel's programs
                    rows = p0 + tl.arange(0, SSM_P)
                    sumsq += _ssm_slice(zx_ptr + m * stride_o, ssm_ptr + m * stride_sb, A_ptr, D_ptr, dt_bias_ptr,
                                        gated_ptr + m * d_inner, head, g, rows, cols, rows < p, cols < n, p, n,
                                        d_inner, groups, stride_sh, stride_sp, stride_sn, ACC)  # fmt: skip
                tl.store(stats_ptr + (m * groups + g) * heads_per_group + head % heads_per_group, sumsq)


def fits(
    hidden: torch.Tensor, residual, norm_weight, norm_bias, norm_eps, in_weight: torch.Tensor, conv_state, conv_weight,
    conv_bias, ssm_state: torch.Tensor, A, D, dt_bias, gate_weight, gate_eps, out_weight, counters=None,
) -> bool:  # fmt: skip
    """Whether :func:`mamba_block_step` serves this call (its arguments): its GEMVs' reductions, d_model and
    d_inner, within :func:`gemv.serves`; the backend composes the op of its parts for the rest."""
    d_inner = ssm_state.shape[1] * ssm_state.shape[2]
    return gemv.serves(hidden, hidden.shape[0], max(hidden.shape[-1], d_inner))


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
    counters: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`zonos.ops.mamba_step.mamba_block_step` (the composition it is tested against), for
    the calls :func:`fits` accepts. With :data:`SSM_IN_PROJ` and the decode cache's ``counters`` (h,) int32 zeros
    (left zero), the state update runs inside in_proj's launch (two launches, where the shapes allow)."""
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

    tile = gemv.block_n(d)
    if SSM_IN_PROJ and counters is not None and p % tile == 0 and n % tile == 0:
        if counters.shape != (h,) or counters.dtype != torch.int32 or not counters.is_contiguous():
            raise ValueError(f"mamba_block_step's counters must be contiguous int32 zeros of shape ({h},)")
        zx, total, gated, stats = _in_proj_with_state_update(
            hidden, residual, norm_weight, norm_bias, norm_eps, in_weight, conv_state, conv_weight, conv_bias,
            ssm_state, A, D, dt_bias, counters,
        )  # fmt: skip
    else:
        zx, total = gemv.gemv(
            hidden, in_weight, prologue=gemv.LAYER_NORM, residual=residual, norm_weight=norm_weight,
            norm_bias=norm_bias, eps=norm_eps, epilogue=gemv.CONV, conv=(conv_state, conv_weight, conv_bias, d_inner),
        )  # fmt: skip
        tiles = triton.cdiv(p, BLOCK_P)
        programs = tiles * (h // groups)
        gated = torch.empty(b, d_inner, device=device, dtype=cdt)
        stats = torch.empty(b, groups, programs, device=device, dtype=cdt)
        _ssm_gate_kernel[(tiles, h, b)](
            zx, ssm_state, A, D, dt_bias, gated, stats,
            p, n, d_inner, groups, h // groups, zx.stride(0), *ssm_state.stride(),
            **ssm_gate_constexprs(p, n, programs, hidden.dtype), num_warps=STATE_WARPS, **pdl.options(device),
        )  # fmt: skip
    out, _ = gemv.gemv(
        gated, out_weight, prologue=gemv.GATED_RMS, norm_weight=gate_weight, eps=gate_eps, stats=stats,
        group_size=d_inner // groups, out_dtype=zx.dtype,
    )  # fmt: skip
    return out, total


def ssm_gate_constexprs(p: int, n: int, programs: int, dtype: torch.dtype) -> dict:
    """The constexprs ``_ssm_gate_kernel`` is launched with (all but PDL's ``GDC``)."""
    return dict(BLOCK_P=BLOCK_P, BLOCK_S=triton.next_power_of_2(n), PROGRAMS=programs, ACC=gemv.acc_tl(dtype))


def in_proj_ssm_constexprs(
    b: int, d: int, h: int, p: int, n: int, groups: int, kc: int, dtype: torch.dtype, *,
    residual: bool = True, norm_bias: bool = True, conv_bias: bool = True,
) -> dict:  # fmt: skip
    """The constexprs ``_in_proj_ssm_kernel`` is launched with for ``b`` rows of a block of d_model ``d``, ``h`` heads
    of ``p`` channels, state ``n``, ``groups`` groups and conv width ``kc`` (all but PDL's ``GDC``); its grid is
    ``SHARED_TILES + h · HEAD_TILES`` programs."""
    tile = gemv.block_n(d)
    bc_tiles, dt_tiles, head_tiles = 2 * groups * n // tile, triton.cdiv(h, tile), 2 * p // tile
    return dict(
        M=b, BLOCK_N=tile, BLOCK_K=triton.next_power_of_2(d), HAS_RESIDUAL=residual, HAS_NORM_BIAS=norm_bias,
        KC=kc, KCP=triton.next_power_of_2(kc), HAS_CONV_BIAS=conv_bias, BC_TILES=bc_tiles,
        SHARED_TILES=bc_tiles + dt_tiles, HEAD_TILES=head_tiles, TARGET=2 * n // tile + 1 + head_tiles,
        SSM_P=min(BLOCK_P, triton.next_power_of_2(p)), BLOCK_S=triton.next_power_of_2(n), ACC=gemv.acc_tl(dtype),
    )  # fmt: skip


def _in_proj_with_state_update(hidden, residual, norm_weight, norm_bias, eps, in_weight, conv_state, conv_weight,
                               conv_bias, ssm_state, A, D, dt_bias, counters):  # fmt: skip
    """in_proj (its norm, conv) and the state update in one launch (``_in_proj_ssm_kernel``): (zx, residual, gated,
    per-head sums of squares (b, groups, heads per group))."""
    b, d = hidden.shape
    h, p, n, groups, d_inner = step_tail_shapes(conv_state, ssm_state)
    conv_dim = conv_state.shape[1]
    n_in = d_inner + conv_dim + h
    device = hidden.device
    cdt = gemv.acc_dtype(hidden.dtype)
    zx = torch.empty(b, n_in, device=device, dtype=hidden.dtype)
    total = hidden
    if residual is not None:
        total = torch.empty(b, d, device=device, dtype=torch.promote_types(hidden.dtype, residual.dtype))
    gated = torch.empty(b, d_inner, device=device, dtype=cdt)
    stats = torch.empty(b, groups, h // groups, device=device, dtype=cdt)
    constexprs = in_proj_ssm_constexprs(
        b, d, h, p, n, groups, conv_state.shape[2], hidden.dtype, residual=residual is not None,
        norm_bias=norm_bias is not None, conv_bias=conv_bias is not None,
    )  # fmt: skip
    _in_proj_ssm_kernel[(constexprs["SHARED_TILES"] + h * constexprs["HEAD_TILES"],)](
        hidden, residual if residual is not None else hidden, norm_weight,
        norm_bias if norm_bias is not None else norm_weight, in_weight, zx, total, conv_state, conv_weight,
        conv_bias if conv_bias is not None else conv_weight, ssm_state, A, D, dt_bias, gated, stats, counters,
        n_in, d, eps, d_inner, conv_dim, p, n, groups, h, h // groups,
        hidden.stride(0), residual.stride(0) if residual is not None else 0, in_weight.stride(0), zx.stride(0),
        total.stride(0), *conv_state.stride(), conv_weight.stride(0), conv_weight.stride(2), *ssm_state.stride(),
        **constexprs, num_warps=gemv.NUM_WARPS, **pdl.options(device),
    )  # fmt: skip
    return zx, total, gated, stats
