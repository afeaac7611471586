"""Snake, the DAC decoder's periodic activation."""

from __future__ import annotations

import torch


def snake(
    x: torch.Tensor, alpha: torch.Tensor, out_dtype: torch.dtype | None = None, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x + sin(alpha * x)**2 / (alpha + 1e-9)`` with a per-channel ``alpha`` (``[1, C, 1]`` for ``x`` ``[B, C, T]``).

    Computed as plain torch ops compute it: in the promoted dtype of ``x`` and ``alpha`` (fp32 for an fp16
    ``x`` and an fp32 ``alpha``), rounded after every op.  ``out_dtype`` rounds the result once more, to
    the dtype the next conv wants (the cast it would otherwise do itself); ``out`` receives the result
    (rounded to its dtype) instead of a new tensor, e.g. a view into the next conv's input buffer.
    """
    if out is not None and out_dtype is not None and out.dtype != out_dtype:
        raise ValueError(f"out is {out.dtype} but out_dtype is {out_dtype}")
    # The 1e-9 keeps alpha == 0 finite; the reciprocal is taken on the small [1, C, 1] tensor.
    h = (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)
    if out is None and out_dtype is None:
        return x + h
    if out is None:
        return (x + h).to(out_dtype)  # what add(out=) computes, without its refusal of tensors that need grad
    return torch.add(x, h, out=out)  # computed in the promoted dtype, then rounded to out's
