"""The DAC decoder's convolutions as single ops: a conv or transposed conv with bias, an optional residual add
and an optional tanh, over a whole sequence or a stream layer's ``[history | new]`` window (:func:`sequence_tail`
builds those windows, Snake included).  Snake runs before the convs, once per sample, as :func:`zonos.ops.snake`.

The one-shot decoder (:class:`zonos.codec.dac.Decoder`) and the streaming decoder
(:mod:`zonos.codec.streaming`) make the same calls, so a fast path whose summation order depends only on
the layer, never on the input length or the position of an output in it, makes the stream equal to the
one-shot decode bit for bit, in 16 bits too.

Numerics (the reference here, and every fast path): input, weight and bias are rounded to ``dtype``; the conv
sums in ``dtype`` (fp32 accumulation for 16-bit dtypes) and its output, bias included, is rounded to
``dtype``; the residual is added and rounded to ``dtype`` again, then tanh, then Snake (rounded to ``dtype``).

Each op takes an optional ``scratch``: a :class:`Scratch` that one caller (a streaming decoder) passes to all its
calls. A fast path keeps there what one call prepares for the next and its launch bookkeeping, so callers on other
CUDA streams or threads never touch it; without one a fast path keeps nothing between calls. The reference ignores
it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zonos.ops.snake import snake


class Scratch:
    """Working memory shared by one caller's sequence of vocoder op calls (see the module docstring). ``kept`` is
    the fast path's: what it holds, keyed by its own names, lives as long as this object (CUDA graphs that captured
    the calls may address it)."""

    def __init__(self) -> None:
        self.kept: dict = {}


def _sequence(history: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if history is None:
        return x
    if history.dtype != x.dtype or history.shape[:2] != x.shape[:2]:
        raise ValueError(
            f"history {tuple(history.shape)} {history.dtype} does not continue x {tuple(x.shape)} {x.dtype}"
        )
    return torch.cat([history, x], dim=-1)


def _valid_samples(valid: torch.Tensor, n: int) -> torch.Tensor:
    """(B, n) bool: sample ``i`` of row ``b`` lies in ``[valid[b, 0], valid[b, 1])``."""
    if valid.dim() != 2 or valid.shape[1] != 2 or valid.dtype != torch.int64:
        raise ValueError(f"valid must be (B, 2) int64 sample ranges; got {tuple(valid.shape)} {valid.dtype}")
    i = torch.arange(n, device=valid.device)
    return (i >= valid[:, :1]) & (i < valid[:, 1:])


def conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    dilation: int = 1,
    padding: int = 0,
    residual: torch.Tensor | None = None,
    residual_history: torch.Tensor | None = None,
    residual_offset: int = 0,
    tanh: bool = False,
    alpha: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    scratch: Scratch | None = None,
) -> torch.Tensor:
    """``conv1d(pad(x), weight, bias, dilation)`` ``+ residual`` then ``tanh``, then Snake, in ``dtype``.

    ``x`` ``[B, C_in, T]`` (a stream layer's ``[history | new]`` window, or a whole sequence), ``weight``
    ``[C_out, C_in, K]``, ``padding`` zeros on both sides.  The output has ``T + 2 padding - (K - 1) dilation``
    samples.  ``residual``: output sample ``t`` adds sample
    ``residual_offset + t`` of ``[residual_history | residual]``.  ``alpha``: Snake with these per-channel
    alphas applied to the result (computed as :func:`zonos.ops.snake` computes it, rounded to ``dtype``: the
    Snake that feeds the next conv).  ``dtype`` defaults to ``weight``'s promoted with ``x``'s.
    """
    dtype = dtype or torch.promote_types(x.dtype, weight.dtype)
    u = x.to(dtype)
    if padding:
        u = F.pad(u, (padding, padding))
    y = F.conv1d(u, weight.to(dtype), None if bias is None else bias.to(dtype), dilation=dilation)
    if residual is not None:
        res = _sequence(residual_history, residual)[..., residual_offset : residual_offset + y.shape[-1]]
        if res.shape[-1] != y.shape[-1]:
            n = res.shape[-1]
            raise ValueError(f"the residual has {n} samples from offset {residual_offset}, not {y.shape[-1]}")
        y = (y + res).to(dtype)
    if tanh:
        y = torch.tanh(y)
    if alpha is None:
        return y
    if alpha.numel() != y.shape[1]:
        raise ValueError(f"Snake after conv1d needs {y.shape[1]} alphas; got {alpha.numel()}")
    return snake(y, alpha.reshape(1, -1, 1), dtype)


def check_unfold(unfold: tuple[int, ...]) -> None:
    """Raise ValueError unless ``unfold`` is a :func:`sequence_tail` hint: ``(kernel size, dilation)``, two positive
    ints, or ``(kernel size, stride, start, length)``, positive, positive and two non-negative ints."""
    ok = isinstance(unfold, tuple) and len(unfold) in (2, 4) and all(type(v) is int for v in unfold)
    if not (ok and min(unfold[:2]) > 0 and min(unfold[2:], default=0) >= 0):
        raise ValueError(
            "unfold must be (kernel size, dilation) of a conv1d or (kernel size, stride, start, length) of a "
            f"conv_transpose1d; got {unfold!r}"
        )


def conv_transpose1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    stride: int,
    start: int = 0,
    length: int | None = None,
    dtype: torch.dtype | None = None,
    scratch: Scratch | None = None,
) -> torch.Tensor:
    """Samples ``start .. start + length - 1`` of ``conv_transpose1d(x, weight, bias, stride)``.

    ``weight`` ``[C_in, C_out, K]``; the uncropped output of ``L`` inputs has ``(L - 1) stride + K`` samples
    (``length`` defaults to the rest of them; ``nn.ConvTranspose1d`` with padding ``p`` is ``start = p``,
    ``length = (L - 1) stride + K - 2 p``).  Other arguments as :func:`conv1d`.
    """
    dtype = dtype or torch.promote_types(x.dtype, weight.dtype)
    u = x.to(dtype)
    full = (u.shape[-1] - 1) * stride + weight.shape[-1]
    length = full - start if length is None else length
    if start < 0 or length < 0 or start + length > full:
        raise ValueError(f"samples {start}..{start + length - 1} lie outside the {full} of the transposed conv")
    y = F.conv_transpose1d(u, weight.to(dtype), None if bias is None else bias.to(dtype), stride=stride)
    return y[..., start : start + length]


def sequence_tail(
    history: torch.Tensor,
    x: torch.Tensor,
    length: int,
    *,
    out: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
    unfold: tuple[int, ...] | None = None,
    raw: tuple[torch.Tensor, int, torch.Tensor] | None = None,
    scratch: Scratch | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """The last ``length`` samples of ``[history | x]`` in ``history``'s dtype, with ``snake(x, alpha)`` in place
    of ``x`` when ``alpha`` is given: a stream layer's next history, or its next input window (the kept history,
    then Snake's outputs for the new samples).  Written into ``out`` if given, which may be the leading samples of
    ``history``'s own buffer (a window updated in place).

    ``unfold=(kernel, dilation)`` says that :func:`conv1d` with that kernel size and dilation (no padding, in
    ``history``'s dtype) reads the result next; ``unfold=(kernel, stride, start, length)``, that
    :func:`conv_transpose1d` with that kernel size, stride, start and length does.  It changes nothing here; a fast
    path may prepare that conv's operands in the same launch (in ``scratch``, for that conv's call with the same
    ``scratch``).

    ``raw=(history2, length2, out2)`` also writes the last ``length2`` samples of ``[history2 | x]``, with ``x``
    as given (no Snake), into ``out2`` under the same rules as ``out``: a residual unit's raw inputs, kept beside
    its first conv's window, so that a fast path reads ``x`` once for both.

    ``valid`` (B, 2) int64: per row, the range ``[lo, hi)`` of ``x``'s samples that hold signal; the others are read
    as zeros (the zero padding before a stream's start and after its end, in rows of a
    :class:`~zonos.codec.slab.VocoderSlab` whose pushes span them)."""
    if unfold is not None:
        check_unfold(unfold)
    if valid is not None:
        x = torch.where(_valid_samples(valid, x.shape[-1])[:, None, :], x, x.new_zeros(()))
    if raw is not None:
        raw_history, raw_length, raw_out = raw
        sequence_tail(raw_history, x, raw_length, out=raw_out)
    if alpha is not None:
        if alpha.numel() != x.shape[1]:
            raise ValueError(f"Snake needs {x.shape[1]} alphas; got {alpha.numel()}")
        x = snake(x, alpha.reshape(1, -1, 1), history.dtype)
    seq = _sequence(history, x.to(history.dtype))
    if not 0 <= length <= seq.shape[-1]:
        raise ValueError(f"cannot keep {length} of {seq.shape[-1]} samples")
    tail = seq[..., seq.shape[-1] - length :]
    if out is None:
        return tail.clone()
    if out.shape != tail.shape or out.dtype != tail.dtype:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} cannot hold the {length} last samples")
    return out.copy_(tail)
