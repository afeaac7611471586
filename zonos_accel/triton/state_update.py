"""One decode token of the Mamba2 recurrence (``zonos.ops.ssd_step``) as one Triton kernel.

Per (sequence, head), with the step size ``dt`` (softplus(dt + dt_bias) when asked) and decay exp(dt · A)
shared by the head's ``p`` channels:

    state ← exp(dt · A) · state + dt · x ⊗ B        (p × n, stored back in the state's dtype)
    y     = state · C + D · x                        (from the fp32 state, before it is rounded)

One program owns ``BLOCK_P`` channels of one head of one sequence: it reads that slice of the state once,
writes it back in place and writes y. Head and sequence index the grid's second and third axes, so up to
65535 sequences (slots) run in one launch.
"""

from __future__ import annotations

import torch

from zonos_accel.triton import pdl
from zonos_accel.triton._support import check_tensors, tl, triton
from zonos_accel.triton.pdl import enter

# Channels per program and warps, pinned (no autotuning: the kernel writes its input). 16 × 128 bf16 state
# elements per program give 4 · 64 · batch programs at Zonos-v0.1-hybrid size (64 heads × 64 × 128). H200,
# benchmarks/mamba_decode_ops.py (34 layers in one graph, dt bias + softplus, D): 2.0 / 2.9 / 10.4 / 270 µs per
# layer at batch 1 / 2 / 16 / 512 against mamba_ssm's selective_state_update at 2.6 / 4.4 / 20.2 / 582 (at 512
# slots: 4.0 TB/s of state read and written).
BLOCK_P = 16
NUM_WARPS = 4
MAX_BATCH = 65535  # the grid's third axis


@triton.jit
def _softplus(v):
    # torch's softplus with its default threshold of 20 (above it, the identity).
    return tl.where(v <= 20.0, tl.log(1.0 + tl.exp(v)), v)


@triton.jit
def _state_update_kernel(
    state_ptr,
    x_ptr,
    dt_ptr,
    dt_bias_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    y_ptr,
    p,
    n,
    heads_per_group,
    stride_sb,
    stride_sh,
    stride_sp,
    stride_sn,
    stride_xb,
    stride_xh,
    stride_xp,
    stride_dtb,
    stride_dth,
    stride_Bb,
    stride_Bg,
    stride_Bn,
    stride_Cb,
    stride_Cg,
    stride_Cn,
    stride_yb,
    stride_yh,
    HAS_D: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GDC: tl.constexpr,
):
    enter(GDC)
    pb = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // heads_per_group
    rows = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < p
    col_ok = cols < n
    tile_ok = row_ok[:, None] & col_ok[None, :]

    dt = tl.load(dt_ptr + b * stride_dtb + h * stride_dth).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + h).to(tl.float32)
    if DT_SOFTPLUS:
        dt = _softplus(dt)
    decay = tl.exp(dt * tl.load(A_ptr + h).to(tl.float32))

    state_ptrs = state_ptr + b * stride_sb + h * stride_sh + rows[:, None] * stride_sp + cols[None, :] * stride_sn
    state = tl.load(state_ptrs, mask=tile_ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + b * stride_xb + h * stride_xh + rows * stride_xp, mask=row_ok, other=0.0).to(tl.float32)
    Bv = tl.load(B_ptr + b * stride_Bb + g * stride_Bg + cols * stride_Bn, mask=col_ok, other=0.0).to(tl.float32)
    Cv = tl.load(C_ptr + b * stride_Cb + g * stride_Cg + cols * stride_Cn, mask=col_ok, other=0.0).to(tl.float32)

    state = state * decay + (dt * x)[:, None] * Bv[None, :]
    tl.store(state_ptrs, state.to(state_ptr.dtype.element_ty), mask=tile_ok)
    y = tl.sum(state * Cv[None, :], axis=1)
    if HAS_D:
        y += x * tl.load(D_ptr + h).to(tl.float32)
    tl.store(y_ptr + b * stride_yb + h * stride_yh + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


def ssd_step(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.ssd.ssd_step` (the reference it is tested against): updates ``state``
    (b, h, p, n) in place and returns y (b, h, p) in x's dtype; computes in fp32.

    Any strides (the mixer passes x, B and C as views of one projection); b up to 65535.
    """
    b, h, p, n = state.shape
    g = B.shape[1]
    check_tensors("ssd_step", state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias)
    if x.shape != (b, h, p) or dt.shape != (b, h) or A.shape != (h,) or B.shape != (b, g, n) or C.shape != B.shape:
        raise ValueError(
            f"ssd_step takes state (b, h, p, n), x (b, h, p), dt (b, h), A (h,), B and C (b, g, n); got state "
            f"{tuple(state.shape)}, x {tuple(x.shape)}, dt {tuple(dt.shape)}, A {tuple(A.shape)}, "
            f"B {tuple(B.shape)}, C {tuple(C.shape)}"
        )
    if h % g:
        raise ValueError(f"ssd_step: {h} heads do not split into {g} groups of B and C")
    if b > MAX_BATCH:
        raise ValueError(f"ssd_step runs at most {MAX_BATCH} sequences per launch, got {b}")
    if D is not None and D.shape != (h,) or dt_bias is not None and dt_bias.shape != (h,):
        raise ValueError(f"ssd_step: D and dt_bias must have shape ({h},)")
    A, D, dt_bias = (None if t is None else t.contiguous() for t in (A, D, dt_bias))  # indexed by head alone
    y = torch.empty(b, h, p, device=x.device, dtype=x.dtype)
    if y.numel() == 0:
        return y
    _state_update_kernel[(triton.cdiv(p, BLOCK_P), h, b)](
        state,
        x,
        dt,
        dt_bias if dt_bias is not None else A,
        A,
        B,
        C,
        D if D is not None else A,
        y,
        p,
        n,
        h // g,
        *state.stride(),
        *x.stride(),
        *dt.stride(),
        *B.stride(),
        *C.stride(),
        y.stride(0),
        y.stride(1),
        HAS_D=D is not None,
        HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=dt_softplus,
        BLOCK_P=BLOCK_P,
        BLOCK_N=triton.next_power_of_2(n),
        num_warps=NUM_WARPS,
        **pdl.options(x.device),
    )
    return y
