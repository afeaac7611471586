"""Decode-shaped projections (a few rows of x) with their neighbours fused in: a Triton GEMV whose prologue finishes
the norm before it and whose epilogue starts the op after it, so a decode step launches one kernel where the op-by-op
path launches two or three.

A program owns ``BLOCK_N`` output channels and their whole reduction: it loads its weight tile (``BLOCK_N`` × K, all
of it at once, so every load is in flight together) before it waits for the kernel before it (under PDL; weights do
not depend on that kernel), then, row by row, builds the input row in registers (the prologue), multiplies, and
stores through the epilogue. Every program builds the row itself: a row is a few KB, read from L2, against the
program's 16 KB of weights (:data:`TILE_ELEMENTS`).

Prologues (``PROLOGUE``):

- ``NONE``: x as it is.
- ``LAYER_NORM``: residual ← x + residual (program 0 stores it), then LayerNorm: the pre-norm block entry.
- ``GATED_RMS``: x is the gated value y · SiLU(z) (float32) of a Mamba2 mixer and ``stats`` its per-program sums of
  squares per (row, group) (zonos_accel/triton/mamba_block.py); the program adds them in a fixed order (the norm's
  scale) and applies it and the norm weight.

Epilogues (``EPILOGUE``):

- ``NONE``: the projection (+ bias).
- ``CONV``: outputs ``conv_lo .. conv_hi`` take a Mamba2 conv step (shift into the conv state, conv, bias, SiLU): a
  channel's state belongs to the one program that computes the channel, so the shift needs no ordering.
- ``GLU``: the weight holds [value | gate] rows (2N × K); each program loads both tiles and stores value · SiLU(gate)
  (the gated MLP's fc1 and activation).

Rounded where the op-by-op path rounds: the residual sum, the normalized row, the projection (both halves of a GLU),
SiLU before the GLU product and the conv output to the activation dtype; accumulation in float32 (float64 for
float64 inputs). In float32 the results equal that path's up to the order of sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zonos_accel.triton import pdl
from zonos_accel.triton._support import check_tensors, interpreting, tl, triton
from zonos_accel.triton.pdl import enter

MAX_ROWS = 16  # rows (batch × CFG) a fused GEMV serves: its rows are unrolled; larger ones are GEMMs (cuBLAS)
MAX_K = 16384  # the longest reduction: a program holds whole rows of x and of its weight tile in registers
# Weight elements per program, all loaded at once: 4 output channels of a K = 2048 projection. ptxas (sm_90, compiled
# on the CPU) gives 8 warps 92-120 registers a thread for K ≤ 4096 (two programs per SM), against 146-186 with 16384
# (one): each thread also holds its share of the K-long input row. Not yet timed on a GPU (benchmarks/fused_gemv.py).
TILE_ELEMENTS = 8192
NUM_WARPS = 8

NONE, LAYER_NORM, GATED_RMS = 0, 1, 2  # prologues
CONV, GLU = 1, 2  # epilogues (and NONE)
# The same as constants a kernel may read (Triton refuses other globals inside @jit functions).
K_NONE, K_LAYER_NORM, K_GATED_RMS = tl.constexpr(NONE), tl.constexpr(LAYER_NORM), tl.constexpr(GATED_RMS)
K_CONV, K_GLU = tl.constexpr(CONV), tl.constexpr(GLU)


@triton.jit
def _layer_norm_row(x_ptr, r_ptr, sum_ptr, lnw, lnb, k, k_ok, K, eps, store_sum, HAS_RESIDUAL: tl.constexpr,
                    HAS_NORM_BIAS: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """One row's residual add (stored by the program told to) and LayerNorm, in ``ACC``."""
    x = tl.load(x_ptr + k, mask=k_ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + k, mask=k_ok, other=0.0)
        x = (x.to(ACC) + r.to(ACC)).to(sum_ptr.dtype.element_ty)  # rounded like a torch add
        if store_sum:
            tl.store(sum_ptr + k, x, mask=k_ok)
    xf = x.to(ACC)
    mean = tl.sum(xf, axis=0) / K
    centered = tl.where(k_ok, xf - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / K + eps)
    y = centered * rstd * lnw
    if HAS_NORM_BIAS:
        y += lnb
    return y


@triton.jit
def _gated_rms_row(x_ptr, stats_ptr, nw, k, k_ok, group_size, eps, GROUPS: tl.constexpr, PROGRAMS: tl.constexpr,
                   PROGRAMS_P2: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr):  # fmt: skip
    """One row of RMSNorm(gated) · weight from the gated values and their per-program sums of squares."""
    v = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(ACC)
    j = tl.arange(0, PROGRAMS_P2)
    group = k // group_size
    scale = tl.zeros([BLOCK_K], dtype=ACC)
    for g in tl.static_range(GROUPS):
        partials = tl.load(stats_ptr + g * PROGRAMS + j, mask=j < PROGRAMS, other=0.0).to(ACC)
        scale = tl.where(group == g, 1.0 / tl.sqrt(tl.sum(partials, axis=0) / group_size + eps), scale)
    return v * scale * nw


@triton.jit
def gemv_tile(
    n0, store_sum,
    x_ptr, r_ptr, nw_ptr, nb_ptr, stats_ptr, w_ptr, bias_ptr, out_ptr, sum_ptr, conv_ptr, cw_ptr, cb_ptr,
    N, K, conv_lo, conv_hi, eps, group_size,
    stride_x, stride_r, stride_w, stride_o, stride_s, stride_cb, stride_cc, stride_ck, stride_wc, stride_wk,
    M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, HAS_NORM_BIAS: tl.constexpr, HAS_BIAS: tl.constexpr, GROUPS: tl.constexpr,
    PROGRAMS: tl.constexpr, PROGRAMS_P2: tl.constexpr, KC: tl.constexpr, KCP: tl.constexpr,
    HAS_CONV_BIAS: tl.constexpr, ACC: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    """One program's work: output channels ``n0 .. n0 + BLOCK_N`` for every row (the module docstring); the program
    told ``store_sum`` stores the new residual of a ``LAYER_NORM`` prologue."""
    n = n0 + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    n_ok = n < N
    k_ok = k < K
    tile_ok = n_ok[:, None] & k_ok[None, :]
    w = tl.load(w_ptr + n[:, None] * stride_w + k[None, :], mask=tile_ok, other=0.0)
    if EPILOGUE == K_GLU:
        w_gate = tl.load(w_ptr + (n[:, None] + N) * stride_w + k[None, :], mask=tile_ok, other=0.0)
    enter(GDC)  # everything below reads what the kernels before wrote
    w = w.to(ACC)  # once for every row (TILE_ELEMENTS / (32 · NUM_WARPS) registers a thread)
    if EPILOGUE == K_GLU:
        w_gate = w_gate.to(ACC)
    act = out_ptr.dtype.element_ty
    if PROLOGUE != K_NONE:
        nw = tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(ACC)
        nb = nw  # unread without a norm bias
        if HAS_NORM_BIAS:
            nb = tl.load(nb_ptr + k, mask=k_ok, other=0.0).to(ACC)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(ACC)
        if EPILOGUE == K_GLU:
            bias_gate = tl.load(bias_ptr + N + n, mask=n_ok, other=0.0).to(ACC)
    if EPILOGUE == K_CONV:  # this tile's conv channels; none in most tiles, whose masked accesses touch no memory
        ch = n - conv_lo
        conv_ok = n_ok & (n >= conv_lo) & (n < conv_hi)
        kk = tl.arange(0, KCP)
        taps_ok = conv_ok[:, None] & (kk[None, :] < KC)
        cw = tl.load(cw_ptr + ch[:, None] * stride_wc + kk[None, :] * stride_wk, mask=taps_ok, other=0.0).to(ACC)
        if HAS_CONV_BIAS:
            cb = tl.load(cb_ptr + ch, mask=conv_ok, other=0.0).to(ACC)
    for m in tl.static_range(M):
        if PROLOGUE == K_LAYER_NORM:
            y = _layer_norm_row(x_ptr + m * stride_x, r_ptr + m * stride_r, sum_ptr + m * stride_s, nw, nb, k, k_ok,
                                K, eps, store_sum, HAS_RESIDUAL, HAS_NORM_BIAS, ACC)  # fmt: skip
        elif PROLOGUE == K_GATED_RMS:
            y = _gated_rms_row(x_ptr + m * stride_x, stats_ptr + m * GROUPS * PROGRAMS, nw, k, k_ok, group_size, eps,
                               GROUPS, PROGRAMS, PROGRAMS_P2, BLOCK_K, ACC)  # fmt: skip
        else:
            y = tl.load(x_ptr + m * stride_x + k, mask=k_ok, other=0.0).to(ACC)
        y = y.to(act).to(ACC)  # the input row in the activation dtype, as the op-by-op path hands it over
        v = tl.sum(w * y[None, :], axis=1)
        if HAS_BIAS:
            v += bias
        v = v.to(act)
        if EPILOGUE == K_CONV:
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
            v = tl.where(conv_ok, c.to(act), v)
        elif EPILOGUE == K_GLU:
            gate = tl.sum(w_gate * y[None, :], axis=1)
            if HAS_BIAS:
                gate += bias_gate
            gate = gate.to(act).to(ACC)
            silu = (gate * tl.sigmoid(gate)).to(act).to(ACC)  # SiLU rounded before the product, as two ops round
            v = (v.to(ACC) * silu).to(act)
        tl.store(out_ptr + m * stride_o + n, v, mask=n_ok)


@triton.jit
def _gemv_kernel(

    x_ptr, r_ptr, nw_ptr, nb_ptr, stats_ptr, w_ptr, bias_ptr, out_ptr, sum_ptr, conv_ptr, cw_ptr, cb_ptr,
    N, K, conv_lo, conv_hi, eps, group_size,
    stride_x, stride_r, stride_w, stride_o, stride_s, stride_cb, stride_cc, stride_ck, stride_wc, stride_wk,
    M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, HAS_NORM_BIAS: tl.constexpr, HAS_BIAS: tl.constexpr, GROUPS: tl.constexpr,
    PROGRAMS: tl.constexpr, PROGRAMS_P2: tl.constexpr, KC: tl.constexpr, KCP: tl.constexpr,
    HAS_CONV_BIAS: tl.constexpr, ACC: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    gemv_tile(
        pid * BLOCK_N, pid == 0, x_ptr, r_ptr, nw_ptr, nb_ptr, stats_ptr, w_ptr, bias_ptr, out_ptr, sum_ptr,
        conv_ptr, cw_ptr, cb_ptr, N, K, conv_lo, conv_hi, eps, group_size, stride_x, stride_r, stride_w,
        stride_o, stride_s, stride_cb, stride_cc, stride_ck, stride_wc, stride_wk, M, BLOCK_N, BLOCK_K,
        PROLOGUE, EPILOGUE, HAS_RESIDUAL, HAS_NORM_BIAS, HAS_BIAS, GROUPS, PROGRAMS, PROGRAMS_P2, KC, KCP,
        HAS_CONV_BIAS, ACC, GDC,
    )  # fmt: skip


def block_n(k: int, glu: bool = False) -> int:
    """Output channels per program for a reduction of ``k`` (a power of two)."""
    return max(1, min(64, TILE_ELEMENTS // (triton.next_power_of_2(k) * (2 if glu else 1))))


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the kernels accumulate in for inputs of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def acc_tl(dtype: torch.dtype):
    """:func:`acc_dtype` as the kernels' ``ACC`` constexpr."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def gemv_constexprs(
    m: int,
    k: int,
    prologue: int,
    epilogue: int,
    dtype: torch.dtype,
    *,
    residual: bool = False,
    norm_bias: bool = False,
    bias: bool = False,
    groups: int = 1,
    programs: int = 1,
    kc: int = 1,
    conv_bias: bool = False,
) -> dict:
    """The constexprs ``_gemv_kernel`` is launched with for ``m`` rows of reductions of ``k`` in ``dtype`` (all but
    PDL's ``GDC``): what :func:`gemv` launches, and what benchmarks/kernel_resources.py and the compile test compile."""
    return dict(
        M=m, BLOCK_N=block_n(k, epilogue == GLU), BLOCK_K=triton.next_power_of_2(k), PROLOGUE=prologue,
        EPILOGUE=epilogue, HAS_RESIDUAL=residual, HAS_NORM_BIAS=norm_bias, HAS_BIAS=bias, GROUPS=groups,
        PROGRAMS=programs, PROGRAMS_P2=triton.next_power_of_2(programs), KC=kc, KCP=triton.next_power_of_2(kc),
        HAS_CONV_BIAS=conv_bias, ACC=acc_tl(dtype),
    )  # fmt: skip


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    prologue: int = NONE,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_bias: torch.Tensor | None = None,
    eps: float = 0.0,
    stats: torch.Tensor | None = None,
    group_size: int = 1,
    epilogue: int = NONE,
    conv: tuple | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launch the fused GEMV on x (M, K), M ≤ :data:`MAX_ROWS`, against ``weight`` (N × K, or 2N × K for ``GLU``).

    ``LAYER_NORM`` takes ``residual`` (or None: x alone), ``norm_weight``, ``norm_bias`` and ``eps``, and returns the
    new residual second (x when ``residual`` is None); ``GATED_RMS`` takes ``stats`` (M, groups, programs), the norm's
    ``norm_weight``, ``eps`` and ``group_size``. ``CONV`` takes ``conv`` = (state (M, C, k), conv weight (C, 1, k), conv
    bias or None, first output channel of the conv). Returns (out (M, N) in ``out_dtype``, by default x's dtype (the
    residual sum's for ``LAYER_NORM``); the new residual or None). Accumulates in :func:`acc_dtype` of x's dtype.
    The caller checks shapes and dtypes; the tensors' last dims must be contiguous.
    """
    m, k = x.shape
    n = weight.shape[0] // (2 if epilogue == GLU else 1)
    device = x.device
    total = None
    if prologue == LAYER_NORM:
        total = x
        if residual is not None:
            total = torch.empty(m, k, device=device, dtype=torch.promote_types(x.dtype, residual.dtype))
    out = torch.empty(m, n, device=device, dtype=out_dtype or (total.dtype if total is not None else x.dtype))
    if prologue == GATED_RMS:
        groups, programs = stats.shape[1:]
    else:
        groups, programs = 1, 1
    if conv is not None:
        state, conv_weight, conv_bias, conv_lo = conv
        conv_args = (conv_lo, conv_lo + state.shape[1])
        conv_strides = (*state.stride(), conv_weight.stride(0), conv_weight.stride(2))
    else:
        state = conv_weight = conv_bias = None
        conv_args, conv_strides = (0, 0), (0,) * 5
    kc = state.shape[2] if state is not None else 1

    def ptr(t: torch.Tensor | None) -> torch.Tensor:
        return weight if t is None else t  # a pointer the kernel never reads (its constexpr flag is off)

    constexprs = gemv_constexprs(
        m, k, prologue, epilogue, x.dtype, residual=residual is not None, norm_bias=norm_bias is not None,
        bias=bias is not None, groups=groups, programs=programs, kc=kc, conv_bias=conv_bias is not None,
    )  # fmt: skip
    _gemv_kernel[(triton.cdiv(n, constexprs["BLOCK_N"]),)](
        x, ptr(residual), ptr(norm_weight), ptr(norm_bias), ptr(stats), weight, ptr(bias), out, ptr(total),
        ptr(state), ptr(conv_weight), ptr(conv_bias),
        n, k, *conv_args, eps, group_size,
        x.stride(0), residual.stride(0) if residual is not None else 0, weight.stride(0), out.stride(0),
        total.stride(0) if total is not None else 0, *conv_strides,
        **constexprs, num_warps=NUM_WARPS,
        **pdl.options(device),
    )  # fmt: skip
    return out, total


DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def serves(x: torch.Tensor, rows: int, k: int) -> bool:
    """Whether the fused GEMV takes ``rows`` rows of reductions of ``k`` of ``x``'s dtype on ``x``'s device: at most
    :data:`MAX_ROWS` and :data:`MAX_K`, a float dtype, a CUDA device (or the CPU under Triton's interpreter)."""
    on_device = x.is_cuda or (interpreting() and x.device.type == "cpu")
    return on_device and 0 < rows <= MAX_ROWS and k <= MAX_K and x.dtype in DTYPES


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.linear.linear`: decode-shaped calls (at most :data:`MAX_ROWS` rows of x of at
    most :data:`MAX_K`, one float dtype) on the fused GEMV with no prologue, so they launch with PDL and stream their
    weights before their wait like the fused ones; the rest (prefill, mixed dtypes) on ``F.linear``."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    same = x.dtype == weight.dtype and (bias is None or bias.dtype == x.dtype)
    if not (same and weight.dim() == 2 and serves(x, rows, x.shape[-1])):
        return F.linear(x, weight, bias)
    check_tensors("linear", x=x, weight=weight, bias=bias)
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(f"linear: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}")
    out, _ = gemv(x.reshape(rows, x.shape[-1]).contiguous(), weight.contiguous(), bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])
