"""Lookups in stacked embedding tables."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def embedding_sum(ids: torch.Tensor, weight: torch.Tensor, table_rows: int) -> torch.Tensor:
    """ids (b, k, l) → (b, l, d): Σ over the k tables of table j's row ``ids[:, j]``, where ``weight`` holds
    the tables stacked (table j at rows ``j * table_rows ..``). Summed in float32 and rounded once to the
    weight's dtype (as torch's ``sum`` of a 16-bit tensor does). Ids must be in 0..table_rows-1: one past
    a table reads the next table."""
    offsets = torch.arange(ids.shape[1], device=ids.device)[:, None] * table_rows
    return F.embedding(ids + offsets, weight).sum(1)


def codebook_rows(
    codes: torch.Tensor, tables: torch.Tensor, codebook_size: int, bounds: torch.Tensor | None = None
) -> torch.Tensor:
    """codes (b, q, t) → (b, q d, t): row ``j d + i`` is entry ``i`` of codebook ``j``'s row ``codes[:, j]``, where
    ``tables`` (q codebook_size, d) holds the codebooks stacked.  The DAC's latent is one kernel-1 conv of these rows.

    With ``bounds`` (int64, ``[min, max]``), the codes' range is folded into it in place and out-of-range codes are
    clamped into their codebook, for a caller that checks the range later instead of reading the codes now (which
    would make the host wait for the GPU).  Without it, codes must be in ``0 .. codebook_size - 1``."""
    b, q, t = codes.shape
    check_bounds(bounds, codes)
    if bounds is not None:
        if codes.numel():
            lo, hi = torch.aminmax(codes)
            torch.minimum(bounds[0], lo, out=bounds[0])
            torch.maximum(bounds[1], hi, out=bounds[1])
        codes = codes.clamp(0, codebook_size - 1)
    offsets = torch.arange(0, q * codebook_size, codebook_size, device=codes.device)[:, None]
    return F.embedding(codes + offsets, tables).permute(0, 1, 3, 2).reshape(b, q * tables.shape[1], t)


def check_bounds(bounds: torch.Tensor | None, codes: torch.Tensor) -> None:
    """``codebook_rows``'s ``bounds``: None, or a contiguous int64 ``[min, max]`` on the codes' device."""
    if bounds is not None and (
        bounds.dtype != torch.int64
        or bounds.shape != (2,)
        or not bounds.is_contiguous()
        or bounds.device != codes.device
    ):
        raise ValueError(
            f"bounds must be a contiguous int64 tensor [min, max] on {codes.device}; "
            f"got {bounds.dtype} {tuple(bounds.shape)} on {bounds.device}"
        )
