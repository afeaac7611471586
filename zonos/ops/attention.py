"""Causal attention of new tokens against a preallocated KV cache: the prefill form (n tokens) and the
decode form (one token).

Both take the position of the first new token as a device tensor, either a scalar shared by the batch or one
position per row (b,) (the engine's slots sit at different positions), and mask the cache rather than slicing
it, so their shapes do not depend on the position: one CUDA graph serves every position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """Causal softmax attention of n new tokens q (b, n, hq, d) → (b, n, hq, d).

    The new tokens' keys and values are already in the caches (b, max_seqlen, hkv, d) at rows
    ``position`` .. ``position + n - 1`` (``position`` a device scalar, or (b,) one per row); query i sees
    rows 0 .. ``position + i``. Each kv head serves hq // hkv query heads (GQA).
    """
    n = q.shape[1]
    rows = torch.arange(k_cache.shape[1], device=q.device)
    last_visible = position.reshape(-1, 1) + torch.arange(n, device=q.device)  # (1 or b, n)
    mask = (rows <= last_visible[..., None])[:, None]  # (1 or b, 1, n, max_seqlen)
    q, k, v = (t.transpose(1, 2) for t in (q, k_cache, v_cache))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return o.transpose(1, 2)


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """Softmax attention of q (b, 1, hq, d) over cache rows 0..``position`` (a device scalar, or (b,) one per
    row) → (b, 1, hq, d).

    :func:`prefill_attention` for one token (a separate op because one query wants a different kernel).
    """
    mask = torch.arange(k_cache.shape[1], device=q.device) <= position.reshape(-1, 1)  # (1 or b, max_seqlen)
    q, k, v = (t.transpose(1, 2) for t in (q, k_cache, v_cache))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None], enable_gqa=True)
    return o.transpose(1, 2)
