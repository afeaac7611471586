"""Mamba2 structured state-space duality (SSD): the chunked prefill scan and the one-token step.

Recurrence, per batch b, head h (headdim p, state size n, group g = h // (heads / groups)):

    state_t = exp(dt_t · A_h) · state_{t-1} + dt_t · x_t ⊗ B_t        (p × n)
    y_t     = state_t · C_t + D_h · x_t

``dt`` is already positive (softplus applied by the caller). The chunked scan evaluates the same
recurrence in blocks of ``chunk_size`` tokens: a quadratic (attention-like) form inside each chunk,
a recurrence over chunk boundary states between chunks. It computes in float32 (float64 when the
inputs are float64) and returns y in the dtype of ``x``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zonos.errors import ZonosInputError
from zonos.ops.precision import compute_dtype


def _segment_sum(a: torch.Tensor) -> torch.Tensor:
    """(..., T) → (..., T, T) with out[i, j] = a[j+1] + … + a[i] for i ≥ j and −inf above the diagonal.

    Built from masked cumulative sums rather than a difference of cumsums, which loses precision.
    """
    t = a.shape[-1]
    a = a[..., None].expand(*a.shape, t)  # a[..., k, j] = a_k
    strictly_lower = torch.ones(t, t, dtype=torch.bool, device=a.device).tril(-1)
    seg = torch.cumsum(a.masked_fill(~strictly_lower, 0), dim=-2)
    return seg.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=a.device).tril(0), float("-inf"))


def _heads_from_groups(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """(b, l, g, n) → (b, l, heads, n): each group serves heads // g consecutive heads."""
    return t.repeat_interleave(nheads // t.shape[2], dim=2)


def check_scan_inputs(x, dt, A, B, C, chunk_size, D=None, initial_state=None) -> None:
    """ZonosInputError naming the input unless :func:`ssd_scan`'s arguments agree in rank and shape (what a fast
    scan checks before it launches; the reference's own ops raise their own errors)."""
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ZonosInputError(f"ssd_scan: chunk_size must be a positive int, got {chunk_size!r}")
    if x.dim() != 4 or dt.dim() != 3 or B.dim() != 4 or C.shape != B.shape or A.dim() != 1:
        raise ZonosInputError(
            f"ssd_scan takes x (b, l, h, p), dt (b, l, h), A (h,), B and C (b, l, g, n); got x {tuple(x.shape)}, "
            f"dt {tuple(dt.shape)}, A {tuple(A.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)}"
        )
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    if dt.shape != (b, l, h) or A.shape != (h,) or B.shape[:2] != (b, l) or h % g:
        raise ZonosInputError(
            f"ssd_scan: x {tuple(x.shape)}, dt {tuple(dt.shape)}, A {tuple(A.shape)} and B/C {tuple(B.shape)} do not "
            "agree on batch, length and heads (h a multiple of the groups g)"
        )
    if D is not None and D.shape != (h,):
        raise ZonosInputError(f"ssd_scan: D must have shape ({h},), got {tuple(D.shape)}")
    if initial_state is not None and initial_state.shape != (b, h, p, n):
        raise ZonosInputError(f"ssd_scan: initial_state must be {(b, h, p, n)}, got {tuple(initial_state.shape)}")


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
    """Chunked SSD scan over a whole sequence.

    Args:
        x: (b, l, h, p) inputs.
        dt: (b, l, h) positive step sizes.
        A: (h,) negative decay rates.
        B, C: (b, l, g, n) input and output projections, g groups shared by h // g heads.
        chunk_size: block length of the chunked form; any l works (the last chunk may be partial).
        D: (h,) skip connection, or None.
        initial_state: (b, h, p, n) state before the first token, or None for zeros.

    Returns:
        y (b, l, h, p) in x's dtype, and the final state (b, h, p, n) in the compute dtype.
    """
    b, l, h, p = x.shape
    cdt = compute_dtype(x.dtype)
    n_chunks = -(-l // chunk_size)
    pad = n_chunks * chunk_size - l
    # Padding tokens get dt = 0: they neither decay the state nor add to it, so the final state is exact.
    xs = F.pad(x.to(cdt), (0, 0, 0, 0, 0, pad))
    dts = F.pad(dt.to(cdt), (0, 0, 0, pad))
    Bs = F.pad(_heads_from_groups(B, h).to(cdt), (0, 0, 0, 0, 0, pad))
    Cs = F.pad(_heads_from_groups(C, h).to(cdt), (0, 0, 0, 0, 0, pad))

    def chunks(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(b, n_chunks, chunk_size, *t.shape[2:])

    X = chunks(xs * dts[..., None])  # (b, c, s, h, p): dt-weighted inputs
    Bc, Cc = chunks(Bs), chunks(Cs)  # (b, c, s, h, n)
    a = chunks(dts * A.to(cdt)).permute(0, 3, 1, 2)  # (b, h, c, s): log-decay per token
    a_cum = torch.cumsum(a, dim=-1)

    # Inside each chunk: y_t += sum_{s<=t} (C_t·B_s) exp(a_{s+1..t}) X_s
    decay = torch.exp(_segment_sum(a))  # (b, h, c, t, s)
    y = torch.einsum("bcthn,bcshn,bhcts,bcshp->bcthp", Cc, Bc, decay, X)

    # State contributed by each chunk alone, measured at the chunk's end.
    to_end = torch.exp(a_cum[..., -1:] - a_cum)  # (b, h, c, s)
    chunk_states = torch.einsum("bcshn,bhcs,bcshp->bchpn", Bc, to_end, X)

    # Recurrence over chunk boundaries, starting from the initial state, one chunk at a time: a chunk of padding
    # (dt = 0: decay exp(0) = 1, nothing added) passes the state on bit for bit, so rows of a batch padded to a
    # longer sequence end with exactly the state they end with alone.
    state = torch.zeros(b, h, p, Bc.shape[-1], dtype=cdt, device=x.device)
    if initial_state is not None:
        state = initial_state.to(cdt)
    chunk_decay = torch.exp(a_cum[..., -1])  # (b, h, c): decay across each whole chunk
    entering = []
    for c in range(n_chunks):
        entering.append(state)
        state = chunk_decay[:, :, c, None, None] * state + chunk_states[:, c]
    prev_states, final_state = torch.stack(entering, dim=1), state

    # Contribution of the state entering each chunk: y_t += exp(a_{1..t}) C_t · state_in
    y = y + torch.einsum("bcthn,bchpn,bhct->bcthp", Cc, prev_states, torch.exp(a_cum))

    y = y.reshape(b, n_chunks * chunk_size, h, p)[:, :l]
    if D is not None:
        y = y + x.to(cdt) * D.to(cdt)[:, None]
    return y.to(x.dtype), final_state


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
    """One token of the recurrence; updates ``state`` (b, h, p, n) in place and returns y (b, h, p).

    Args: x (b, h, p), dt (b, h), A (h,), B and C (b, g, n), D (h,) or None. The step size is
    ``softplus(dt + dt_bias)`` with ``dt_softplus`` (the mixer's raw projection), else dt (already positive).
    Computes in float32 (float64 for float64 state) and stores the state back in its own dtype.
    """
    h = x.shape[1]
    cdt = compute_dtype(state.dtype)
    Bh = B.repeat_interleave(h // B.shape[1], dim=1).to(cdt)  # (b, h, n)
    Ch = C.repeat_interleave(h // C.shape[1], dim=1).to(cdt)
    dt = dt.to(cdt)
    if dt_bias is not None:
        dt = dt + dt_bias.to(cdt)
    if dt_softplus:
        dt = F.softplus(dt)
    xs = x.to(cdt)
    new = state.to(cdt) * torch.exp(dt * A.to(cdt))[..., None, None] + (dt[..., None] * xs)[..., None] * Bh[:, :, None]
    state.copy_(new)
    y = torch.einsum("bhpn,bhn->bhp", new, Ch)
    if D is not None:
        y = y + xs * D.to(cdt)[:, None]
    return y.to(x.dtype)
