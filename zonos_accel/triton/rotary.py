"""The attention layer's rotary embedding and KV-cache write (``zonos.ops.rotate_and_cache``) in one launch.

The reference builds the cos/sin tables (arange, power, multiply, cos, sin, casts), rotates q and k with
slices, products and cats, and writes keys and values with two ``index_copy_``: about 30 launches per
attention layer at decode. Here each program handles one head vector of one token: a query head is rotated
into the returned queries, a key head is rotated straight into its cache row, a value head is copied into
its cache row. cos and sin are computed in place from the position and rounded to the activation dtype, as
the reference rounds its tables.

Positions are (l,), shared by the batch, or (b, l), each row's own (the engine's slots sit at different
positions); the ``PER_ROW`` constexpr picks which, so shared positions cost no per-row address arithmetic.
Every program depends only on its own token, so a batch gives, row for row, bit for bit what each row gives
alone. A token whose position lies outside the cache (< 0 or >= max_seqlen, which the caller rules out)
still gets its rotated query, but its key and value are dropped: nothing is written outside the cache (the
reference's ``index_copy_`` / ``scatter_`` fail there instead).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from zonos.errors import ZonosInputError
from zonos.ops.rotary import rotate_and_cache as _reference
from zonos_accel.triton import pdl
from zonos_accel.triton.pdl import enter

_inv_freq: dict[tuple, torch.Tensor] = {}


def inverse_frequencies(rotary_dim: int, base: float, device: torch.device) -> torch.Tensor:
    """1 / base^(2i / rotary_dim) in float32, computed exactly as the reference computes it (cached)."""
    key = (rotary_dim, base, device)
    if key not in _inv_freq:
        exponents = torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim
        _inv_freq[key] = 1.0 / (base**exponents)
    return _inv_freq[key]


@triton.jit
def _rotate_and_cache_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    pos_ptr,
    inv_freq_ptr,
    seqlen,
    hq,
    hk,
    max_seqlen,
    stride_pb,
    stride_qb,
    stride_ql,
    stride_qh,
    stride_kb,
    stride_kl,
    stride_kh,
    stride_vb,
    stride_vl,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    d,
    HALF: tl.constexpr,
    HALF_P: tl.constexpr,
    DP: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    PER_ROW: tl.constexpr,
    GDC: tl.constexpr,
):
    enter(GDC)
    token = tl.program_id(0)  # b * seqlen + l
    head = tl.program_id(1)  # query heads, then key heads, then value heads
    b = token // seqlen
    l = token % seqlen
    if PER_ROW:
        pos_ptr += b * stride_pb
    pos = tl.load(pos_ptr + l)
    # A key or value whose position lies outside the cache is dropped: its program does nothing. (A branch, not
    # store masks: Triton 3.9's interpreter turns a scalar condition broadcast into a mask into integers.)
    if (head < hq) | ((pos >= 0) & (pos < max_seqlen)):
        if head < hq:
            src = q_ptr + b * stride_qb + l * stride_ql + head * stride_qh
            dst = q_out_ptr + (token * hq + head) * d
        elif head < hq + hk:
            src = k_ptr + b * stride_kb + l * stride_kl + (head - hq) * stride_kh
            dst = k_cache_ptr + b * stride_cb + pos * stride_cs + (head - hq) * stride_ch
        else:
            src = v_ptr + b * stride_vb + l * stride_vl + (head - hq - hk) * stride_vh
            dst = v_cache_ptr + b * stride_cb + pos * stride_cs + (head - hq - hk) * stride_ch
        j = tl.arange(0, HALF_P)
        j_ok = j < HALF
        if INTERLEAVED:
            i1 = 2 * j
            i2 = 2 * j + 1
        else:
            i1 = j
            i2 = j + HALF
        x1 = tl.load(src + i1, mask=j_ok, other=0.0)
        x2 = tl.load(src + i2, mask=j_ok, other=0.0)
        if head < hq + hk:
            dtype = q_out_ptr.dtype.element_ty
            angle = pos.to(tl.float32) * tl.load(inv_freq_ptr + j, mask=j_ok, other=0.0)
            cos = libdevice.cos(angle).to(dtype).to(tl.float32)
            sin = libdevice.sin(angle).to(dtype).to(tl.float32)
            f1 = x1.to(tl.float32)
            f2 = x2.to(tl.float32)
            tl.store(dst + i1, (f1 * cos - f2 * sin).to(dtype), mask=j_ok)
            tl.store(dst + i2, (f1 * sin + f2 * cos).to(dtype), mask=j_ok)
        else:
            tl.store(dst + i1, x1, mask=j_ok)
            tl.store(dst + i2, x2, mask=j_ok)
        rest = tl.arange(0, DP)
        rest_ok = (rest >= 2 * HALF) & (rest < d)
        tl.store(dst + rest, tl.load(src + rest, mask=rest_ok, other=0.0), mask=rest_ok)


def rotate_and_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    rotary_dim: int,
    base: float,
    interleaved: bool,
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.rotary.rotate_and_cache` (the reference it is tested against)."""
    b, l, hq, d = q.shape
    hk = k.shape[2]
    if positions.dim() == 2 and positions.shape[0] == 1:
        positions = positions[0]  # one row: the shared form's kernel
    per_row = positions.dim() == 2
    if positions.shape != ((b, l) if per_row else (l,)):
        raise ZonosInputError(
            f"rotate_and_cache: positions has shape {tuple(positions.shape)}; pass ({l},) shared by the batch "
            f"or ({b}, {l}), one row of positions per batch row"
        )
    same = k_cache.dtype == v_cache.dtype == q.dtype == k.dtype == v.dtype and k_cache.stride() == v_cache.stride()
    if not rotary_dim or not same or k_cache.stride(-1) != 1 or any(t.stride(-1) != 1 for t in (q, k, v)):
        return _reference(q, k, v, k_cache, v_cache, positions, rotary_dim, base, interleaved)
    inv_freq = inverse_frequencies(rotary_dim, base, q.device)
    positions = positions.contiguous()
    out = torch.empty(b, l, hq, d, device=q.device, dtype=q.dtype)
    half = inv_freq.shape[0]
    _rotate_and_cache_kernel[(b * l, hq + 2 * hk)](
        q,
        k,
        v,
        out,
        k_cache,
        v_cache,
        positions,
        inv_freq,
        l,
        hq,
        hk,
        k_cache.shape[1],
        positions.stride(0) if per_row else 0,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *k_cache.stride()[:3],
        d,
        HALF=half,
        HALF_P=triton.next_power_of_2(half),
        DP=triton.next_power_of_2(d),
        INTERLEAVED=interleaved,
        PER_ROW=per_row,
        num_warps=1,
        **pdl.options(q.device),
    )
    return out
