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
