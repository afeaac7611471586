"""The sum of the 9 codebook embeddings (``zonos.ops.embedding_sum``) in one launch: the offset add, the
lookup and the sum were three."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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
