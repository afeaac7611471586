"""The delay pattern: codebook k (0-based) of frame t is predicted at step t + k + 1.

Delayed layout of T frames is T + n_q columns; column c holds code[k, c - k - 1] for codebook k, and
MASK where that index falls outside 0..T-1. A frame t is complete once column t + n_q is written.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

N_CODEBOOKS = 9  # the DAC 44.1 kHz codec's residual codebooks
CODEBOOK_SIZE = 1024
UNKNOWN = -1  # a delayed-code slot not generated yet


def apply_delay_pattern(codes: torch.Tensor, mask_token: int) -> torch.Tensor:
    """(b, n_q, T) codes → (b, n_q, T + n_q) delayed codes, delay slots filled with ``mask_token``."""
    n_q = codes.shape[1]
    padded = F.pad(codes, (0, n_q), value=mask_token)
    return torch.stack([padded[:, k].roll(k + 1, dims=-1) for k in range(n_q)], dim=1)


def revert_delay_pattern(codes: torch.Tensor) -> torch.Tensor:
    """(b, n_q, S) delayed codes → (b, n_q, S - n_q) frames (inverse of :func:`apply_delay_pattern`)."""
    n_q, s = codes.shape[1], codes.shape[2]
    return torch.stack([codes[:, k, k + 1 : s - n_q + k + 1] for k in range(n_q)], dim=1)
