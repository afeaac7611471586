"""Attention of one new token against a preallocated KV cache (the decode step)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """Softmax attention of q (b, 1, hq, d) over cache rows 0..``position`` (a device scalar) → (b, 1, hq, d).

    The caches are (b, max_seqlen, hkv, d); each kv head serves hq // hkv query heads (GQA). Rows past
    ``position`` are masked rather than sliced, so the shapes do not depend on the position (graph-safe).
    """
    mask = torch.arange(k_cache.shape[1], device=q.device) <= position
    q, k, v = (t.transpose(1, 2) for t in (q, k_cache, v_cache))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, :], enable_gqa=True)
    return o.transpose(1, 2)
