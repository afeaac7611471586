"""Codebook lookups in one launch each: the sum of the 9 codebook embeddings (``zonos.ops.embedding_sum``: the
offset add, the lookup and the sum were three), and the DAC's stacked codebook rows (``zonos.ops.codebook_rows``:
the range tracking, clamp, offsets, lookup and transpose were eight, a tenth of a short streaming push's
launches)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zonos.ops.embedding import check_bounds
from zonos_accel.triton import pdl
from zonos_accel.triton.pdl import enter

BLOCK = 1024


@triton.jit
def _embedding_sum_kernel(
    ids_ptr,
    w_ptr,
    out_ptr,
    length,
    d,
    table_rows,
    stride_ib,
    stride_ik,
    stride_il,
    stride_w,
    TABLES: tl.constexpr,
    BLOCK: tl.constexpr,
    GDC: tl.constexpr,
):
    enter(GDC)
    bl = tl.program_id(0)  # one (sequence, position)
    b = bl // length
    pos = bl % length
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < d
    acc = tl.zeros((BLOCK,), tl.float32)
    for j in tl.static_range(TABLES):  # in table order, as the reference's sum
        row = tl.load(ids_ptr + b * stride_ib + j * stride_ik + pos * stride_il) + j * table_rows
        acc += tl.load(w_ptr + row * stride_w + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + bl * d + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def embedding_sum(ids: torch.Tensor, weight: torch.Tensor, table_rows: int) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.embedding.embedding_sum` (the reference it is tested against)."""
    b, tables, length = ids.shape
    d = weight.shape[1]
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    out = torch.empty(b, length, d, device=weight.device, dtype=weight.dtype)
    _embedding_sum_kernel[(b * length, triton.cdiv(d, BLOCK))](
        ids,
        weight,
        out,
        length,
        d,
        table_rows,
        ids.stride(0),
        ids.stride(1),
        ids.stride(2),
        weight.stride(0),
        TABLES=tables,
        BLOCK=BLOCK,
        **pdl.options(weight.device),
    )
    return out


_INT64_MAX = tl.constexpr(2**63 - 1)


@triton.jit
def _codebook_rows_kernel(
    codes_ptr,
    tables_ptr,
    out_ptr,
    bounds_ptr,
    q,
    length,
    d,
    codebook_size,
    stride_cb,
    stride_cq,
    stride_ct,
    stride_w,
    stride_ob,
    stride_oc,
    stride_ot,
    TRACK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GDC: tl.constexpr,
):
    enter(GDC)
    bq = tl.program_id(0)  # one (sequence, codebook)
    b = bq // q
    j = bq % q
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < length
    code = tl.load(codes_ptr + b * stride_cb + j * stride_cq + t * stride_ct, mask=t_ok, other=0)
    if TRACK:
        tl.atomic_min(bounds_ptr, tl.min(tl.where(t_ok, code, _INT64_MAX), 0))
        tl.atomic_max(bounds_ptr + 1, tl.max(tl.where(t_ok, code, -_INT64_MAX), 0))
        code = tl.minimum(tl.maximum(code, 0), codebook_size - 1)
    i = tl.arange(0, BLOCK_D)
    ok = t_ok[:, None] & (i < d)[None, :]
    row = tl.load(tables_ptr + (code + j * codebook_size)[:, None] * stride_w + i[None, :], mask=ok)
    tl.store(out_ptr + b * stride_ob + (j * d + i)[None, :] * stride_oc + t[:, None] * stride_ot, row, mask=ok)


def codebook_rows(
    codes: torch.Tensor, tables: torch.Tensor, codebook_size: int, bounds: torch.Tensor | None = None
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.embedding.codebook_rows` (the reference it is tested against)."""
    b, q, length = codes.shape
    d = tables.shape[1]
    codes = codes.long()  # the range is tracked in int64
    if tables.stride(1) != 1:
        tables = tables.contiguous()
    check_bounds(bounds, codes)
    out = torch.empty(b, q * d, length, device=tables.device, dtype=tables.dtype)
    if out.numel() == 0:
        return out
    block_t = min(128, triton.next_power_of_2(length))
    _codebook_rows_kernel[(b * q, triton.cdiv(length, block_t))](
        codes,
        tables,
        out,
        codes if bounds is None else bounds,
        q,
        length,
        d,
        codebook_size,
        *codes.stride(),
        tables.stride(0),
        *out.stride(),
        TRACK=bounds is not None,
        BLOCK_T=block_t,
        BLOCK_D=triton.next_power_of_2(d),
        **pdl.options(tables.device),
    )
    return out
