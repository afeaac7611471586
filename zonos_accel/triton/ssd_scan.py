"""The Mamba2 SSD prefill scan (``zonos.ops.ssd_scan``) as three Triton kernels of ours, for any length.

The sequence is cut into chunks of :data:`CHUNK` tokens (the blocking does not change the result beyond rounding:
the caller's ``chunk_size`` is not used), and each stage is one launch over every (chunk, sequence, head):

1. ``_chunk_state_kernel``: the state each chunk adds alone, measured at its end, Σ_s exp(a_end − a_s)·dt_s·x_s ⊗ B_s
   (a_s the cumulative log-decay dt·A inside the chunk), and the chunk's whole decay exp(a_end).
2. ``_state_passing_kernel``: per (sequence, head, block of channels), the recurrence over chunk boundaries from the
   initial state, storing the state entering each chunk and the final one; a chunk of padding (dt = 0) passes the
   state on unchanged.
3. ``_chunk_scan_kernel``: y inside each chunk, the causal (C·Bᵀ ∘ exp(a_t − a_s)·dt_s) · x, plus the entering
   state's exp(a_t)·C·stateᵀ and D·x.

Products that feed the states run in float32 (TF32 three times on the GPU, about float32's accuracy): the prompt's
final state is what every decode step starts from. The attention-like C·Bᵀ·x product runs in the inputs' dtype,
as mamba_ssm's and the CuTeDSL scan's do, and y's share from the entering state in TF32 (float32 inputs: TF32×3).
Kernels compile once per (head dim, state size, dtypes, initial state or not): the length is a runtime value, so
Triton's disk cache serves every prompt of a warm process.
"""

from __future__ import annotations

import torch

from zonos.errors import ZonosInputError
from zonos.ops.ssd import check_scan_inputs
from zonos.ops.ssd import ssd_scan as reference_scan
from zonos_accel.triton import pdl
from zonos_accel.triton._support import check_tensors, tl, triton
from zonos_accel.triton.pdl import enter

CHUNK = 64  # tokens per chunk: the (chunk × chunk) scores and the (head dim × state) chunk states fit a program
STATE_ROWS = 16  # channels of a head per state-passing program (64 × 128 fp32 states in 4 programs)
STATE_PIECE = 32  # state channels per step of the chunk scan's entering-state product
NUM_WARPS = 4
# The chunk scan's warps: ptxas (sm_90, compiled on the CPU) fits its bf16 program in 250 registers a thread with 8
# warps and spills 248 bytes with 4.
SCAN_WARPS = 8
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _chunk_decay(dt_ptr, A_ptr, t, t_ok, h, stride_dtl, Q: tl.constexpr):
    """(dt, cumulative log-decay inside the chunk, its total) of tokens ``t`` (padding: dt = 0). The total is the
    cumulative sum's last element, not a separate sum: exp(total − a_cum) of the chunk's last token is then exactly 1
    (a tree sum differs from the scan by an ulp of the total, which would scale the newest tokens' share)."""
    dt = tl.load(dt_ptr + t * stride_dtl, mask=t_ok, other=0.0).to(tl.float32)
    a_cum = tl.cumsum(dt * tl.load(A_ptr + h).to(tl.float32), axis=0)
    return dt, a_cum, tl.sum(tl.where(tl.arange(0, Q) == Q - 1, a_cum, 0.0), axis=0)


@triton.jit
def _chunk_state_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, states_ptr, decay_ptr,
    L, H, heads_per_group, P, N, chunks,
    stride_xb, stride_xl, stride_xh, stride_dtb, stride_dtl, stride_dth, stride_bb, stride_bl, stride_bg,
    Q: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    enter(GDC)
    c = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    t = c * Q + tl.arange(0, Q)
    t_ok = t < L
    rp = tl.arange(0, BLOCK_P)
    rn = tl.arange(0, BLOCK_N)
    dt, a_cum, a_end = _chunk_decay(dt_ptr + b * stride_dtb + h * stride_dth, A_ptr, t, t_ok, h, stride_dtl, Q)
    weight = tl.exp(a_end - a_cum) * dt  # padding: dt = 0
    x = tl.load(x_ptr + b * stride_xb + h * stride_xh + t[:, None] * stride_xl + rp[None, :],
                mask=t_ok[:, None] & (rp[None, :] < P), other=0.0).to(tl.float32)  # fmt: skip
    Bm = tl.load(B_ptr + b * stride_bb + (h // heads_per_group) * stride_bg + t[:, None] * stride_bl + rn[None, :],
                 mask=t_ok[:, None] & (rn[None, :] < N), other=0.0).to(tl.float32)  # fmt: skip
    state = tl.dot(tl.trans(x * weight[:, None]), Bm, input_precision="tf32x3")  # (P, N)
    cell = (b * chunks + c) * H + h
    tl.store(states_ptr + cell * BLOCK_P * BLOCK_N + rp[:, None] * BLOCK_N + rn[None, :], state)
    tl.store(decay_ptr + (b * H + h) * chunks + c, tl.exp(a_end))


@triton.jit
def _state_passing_kernel(
    states_ptr, decay_ptr, init_ptr, entering_ptr, final_ptr,
    H, P, N, chunks,
    stride_ib, stride_ih, stride_ip, stride_fb, stride_fh, stride_fp,
    HAS_INIT: tl.constexpr, ROWS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    enter(GDC)
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = bh % H
    rp = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    rn = tl.arange(0, BLOCK_N)
    ok = (rp[:, None] < P) & (rn[None, :] < N)
    tile = rp[:, None] * BLOCK_N + rn[None, :]
    if HAS_INIT:
        state = tl.load(init_ptr + b * stride_ib + h * stride_ih + rp[:, None] * stride_ip + rn[None, :], mask=ok,
                        other=0.0).to(tl.float32)  # fmt: skip
    else:
        state = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for c in range(chunks):
        cell = (b * chunks + c) * H + h
        tl.store(entering_ptr + cell * BLOCK_P * BLOCK_N + tile, state, mask=rp[:, None] < BLOCK_P)
        added = tl.load(states_ptr + cell * BLOCK_P * BLOCK_N + tile, mask=rp[:, None] < BLOCK_P, other=0.0)
        state = tl.load(decay_ptr + (b * H + h) * chunks + c) * state + added
    tl.store(final_ptr + b * stride_fb + h * stride_fh + rp[:, None] * stride_fp + rn[None, :], state, mask=ok)


@triton.jit
def _chunk_scan_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, entering_ptr, y_ptr,
    L, H, heads_per_group, P, N, chunks,
    stride_xb, stride_xl, stride_xh, stride_dtb, stride_dtl, stride_dth, stride_bb, stride_bl, stride_bg,
    stride_cb, stride_cl, stride_cg, stride_yb, stride_yl, stride_yh,
    HAS_D: tl.constexpr, Q: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, STATE_PIECE: tl.constexpr,
    FP32: tl.constexpr, GDC: tl.constexpr,
):  # fmt: skip
    enter(GDC)
    c = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    g = h // heads_per_group
    t = c * Q + tl.arange(0, Q)
    t_ok = t < L
    rp = tl.arange(0, BLOCK_P)
    rn = tl.arange(0, BLOCK_N)
    dt, a_cum, _ = _chunk_decay(dt_ptr + b * stride_dtb + h * stride_dth, A_ptr, t, t_ok, h, stride_dtl, Q)
    n_ok = t_ok[:, None] & (rn[None, :] < N)
    Cm = tl.load(C_ptr + b * stride_cb + g * stride_cg + t[:, None] * stride_cl + rn[None, :], mask=n_ok, other=0.0)
    Bm = tl.load(B_ptr + b * stride_bb + g * stride_bg + t[:, None] * stride_bl + rn[None, :], mask=n_ok, other=0.0)
    x = tl.load(x_ptr + b * stride_xb + h * stride_xh + t[:, None] * stride_xl + rp[None, :],
                mask=t_ok[:, None] & (rp[None, :] < P), other=0.0)  # fmt: skip
    if FP32:
        scores = tl.dot(Cm, tl.trans(Bm), input_precision="tf32x3")
    else:
        scores = tl.dot(Cm, tl.trans(Bm))  # in the inputs' dtype, accumulated in float32
    s = tl.arange(0, Q)
    causal = s[None, :] <= tl.arange(0, Q)[:, None]
    decay = tl.exp(tl.where(causal, a_cum[:, None] - a_cum[None, :], float("-inf")))
    scores = scores * decay * dt[None, :]
    if FP32:
        y = tl.dot(scores, x, input_precision="tf32x3")
    else:
        y = tl.dot(scores.to(x.dtype), x)
    # The entering state's share, over the state size in pieces (C loaded again, from L2), which keeps a program's
    # fp32 operands in registers: y += exp(a_t) · C_t · stateᵀ.
    cell = (b * chunks + c) * H + h
    from_state = tl.zeros([Q, BLOCK_P], dtype=tl.float32)
    for n0 in tl.static_range(0, BLOCK_N, STATE_PIECE):
        rs = n0 + tl.arange(0, STATE_PIECE)
        piece = tl.load(C_ptr + b * stride_cb + g * stride_cg + t[:, None] * stride_cl + rs[None, :],
                        mask=t_ok[:, None] & (rs[None, :] < N), other=0.0).to(tl.float32)  # fmt: skip
        entering = tl.load(entering_ptr + cell * BLOCK_P * BLOCK_N + rp[:, None] * BLOCK_N + rs[None, :])
        if FP32:
            from_state += tl.dot(piece, tl.trans(entering), input_precision="tf32x3")
        else:  # TF32: its rounding (~5e-4) is a quarter of y's own in bf16, and TF32×3 spills (ptxas, sm_90)
            from_state += tl.dot(piece, tl.trans(entering), input_precision="tf32")
    y += tl.exp(a_cum)[:, None] * from_state
    if HAS_D:
        y += tl.load(D_ptr + h).to(tl.float32) * x.to(tl.float32)
    tl.store(y_ptr + b * stride_yb + h * stride_yh + t[:, None] * stride_yl + rp[None, :],
             y.to(y_ptr.dtype.element_ty), mask=t_ok[:, None] & (rp[None, :] < P))  # fmt: skip


def state_blocks(p: int, n: int) -> tuple[int, int]:
    """The kernels' (head dim, state size) blocks: powers of two, at least 16 (tl.dot's smallest)."""
    return max(16, triton.next_power_of_2(p)), max(16, triton.next_power_of_2(n))


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`zonos.ops.ssd.ssd_scan`: y (b, l, h, p) in x's dtype and the final state (b, h, p, n)
    in float32 (float64 for float64 inputs, which run the reference). ``chunk_size`` is checked but not used (the
    blocking is :data:`CHUNK`)."""
    check_scan_inputs(x, dt, A, B, C, chunk_size, D, initial_state)
    check_tensors("ssd_scan", x=x, dt=dt, A=A, B=B, C=C, D=D, initial_state=initial_state)
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    if x.dtype == torch.float64:  # the kernels compute in float32: float64 runs the reference
        return reference_scan(x, dt, A, B, C, chunk_size, D=D, initial_state=initial_state)
    if x.dtype not in _DTYPES or B.dtype != x.dtype or C.dtype != x.dtype:
        raise ZonosInputError(f"the Triton ssd_scan takes x, B and C in one of {_DTYPES}, got {x.dtype}, {B.dtype}")
    device = x.device
    y = torch.empty(b, l, h, p, device=device, dtype=x.dtype)
    final = torch.empty(b, h, p, n, device=device, dtype=torch.float32)
    if b == 0 or l == 0:
        final.copy_(initial_state if initial_state is not None else torch.zeros_like(final))
        return y, final
    x, B, C, dt = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, B, C, dt))
    A = A.contiguous()
    chunks = triton.cdiv(l, CHUNK)
    bp, bn = state_blocks(p, n)
    states = torch.empty(b, chunks, h, bp, bn, device=device, dtype=torch.float32)
    entering = torch.empty_like(states)
    decay = torch.empty(b, h, chunks, device=device, dtype=torch.float32)
    launch = {"num_warps": NUM_WARPS, **pdl.options(device)}
    scan_launch = {**launch, "num_warps": SCAN_WARPS}
    common = (l, h, h // g, p, n, chunks, *x.stride()[:3], *dt.stride(), *B.stride()[:3])
    _chunk_state_kernel[(chunks, b * h)](x, dt, A, B, states, decay, *common, Q=CHUNK, BLOCK_P=bp, BLOCK_N=bn,
                                         **launch)  # fmt: skip
    init = initial_state
    init_strides = init.stride()[:3] if init is not None else (0, 0, 0)
    if init is not None and init.stride(-1) != 1:
        init = init.contiguous()
        init_strides = init.stride()[:3]
    _state_passing_kernel[(b * h, triton.cdiv(bp, STATE_ROWS))](
        states, decay, init if init is not None else final, entering, final, h, p, n, chunks,
        *init_strides, *final.stride()[:3],
        HAS_INIT=init is not None, ROWS=STATE_ROWS, BLOCK_P=bp, BLOCK_N=bn, **launch,
    )  # fmt: skip
    _chunk_scan_kernel[(chunks, b * h)](
        x, dt, A, B, C, D if D is not None else A, entering, y, *common, *C.stride()[:3], *y.stride()[:3],
        HAS_D=D is not None, Q=CHUNK, BLOCK_P=bp, BLOCK_N=bn, STATE_PIECE=min(STATE_PIECE, bn),
        FP32=x.dtype == torch.float32, **scan_launch,
    )  # fmt: skip
    return y, final
