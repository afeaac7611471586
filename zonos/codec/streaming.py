"""Exact streaming decoding of DAC codes: audio comes out as code frames arrive.

:class:`StreamingDACDecoder` runs the weights of a :class:`~zonos.codec.dac.DAC` decoder layer by
layer over chunks of frames, keeping in each layer only the input context its kernel still needs
(the explicit-state design of Moshi's streaming convolutions).  Nothing is recomputed: every conv
output sample is computed exactly once, as in the one-shot decoder.

The decoder's convolutions are non-causal ("same" padding), so a sample depends on some future
frames.  Each layer therefore emits only the samples that no future input can change, and
:meth:`StreamingDACDecoder.flush` supplies the zero right padding of the one-shot decoder at the
end.  The concatenation of all outputs equals ``DAC.decode`` of all frames (up to float rounding:
the same products are summed, partly in another order).

Receptive field of the 44.1 kHz model (strides 8, 8, 4, 2; hop 512), from :func:`receptive_field`:

* output sample ``t`` depends on the frames ``floor((t - 4757) / 512) .. floor((t + 4757) / 512)``;
* **lookahead** 4757 samples (9.29 frames, 107.9 ms): after ``n`` frames have been pushed, exactly
  ``max(0, 512 * n - 4757)`` samples are final and have been emitted, so the first audio appears
  once 10 frames are in (363 samples), and each later frame releases 512 more;
* **left context** 4757 samples as well (all convs are symmetric), i.e. up to 10 earlier frames.

How the lookahead adds up, from the output backwards (a conv with kernel ``k``, dilation ``d`` and
padding ``p = (k - 1) d / 2`` looks ``p`` input samples ahead; a transposed conv with stride ``s``,
kernel ``2s`` and padding ``p`` maps output ``t`` to inputs ``floor((t + p) / s) - 1`` and
``floor((t + p) / s)``): final conv 3 and three residual units 3 + 9 + 27 = 39 at 44.1 kHz;
then each block's transposed conv and the residual units at its input rate, and the first conv's 3
frames: ``3 + 39 + 1 + 2*39 + 2*2 + 8*39 + 8*4 + 64*39 + 64*4 + 512*3 = 4757``.

Calls: each layer makes the one-shot decoder's :mod:`zonos.ops` calls on ``[history | new]`` windows: a
``conv1d`` or ``conv_transpose1d`` per conv (bias, the residual add and the final tanh inside it), a
``sequence_tail`` per conv input window (the kept history, then Snake's outputs for the new samples, in the
conv's dtype: the same Snake as the one-shot decoder's ``snake``; a residual unit's also keeps its raw inputs); a
residual unit's inner Snake is applied by its first conv: ~49 launches per steady push (one each on the Triton
path).

Cost: the convolutions do the one-shot decoder's multiply-accumulates, whatever the chunk sizes, plus one
input sample per transposed-conv call (its history, recomputed so that every output is a single conv sum as
in the one-shot decode: ~3% more work at 1-frame pushes; a test counts them).  The state is each conv's last
``(k - 1) d`` inputs (Snake's outputs), each transposed conv's last input and each residual unit's raw
inputs whose output is not final yet.  What small chunks add is per-call cost: on CUDA the pushes are
replayed from CUDA graphs (see :class:`StreamingDACDecoder`), and a steady 2-frame push takes ~0.25 ms
of GPU time on an H200 (53 kernels, the convs most of it: small calls read every weight at a fraction of the
bandwidth, in chains of dependent loads), ~6.5x the one-shot decode's cost for those frames, ~1.3x at 16-frame
pushes and ~1x at 32 (``benchmarks/vocoder_profile.py``, ``benchmarks/streaming.py``, docs/BENCHMARKS.md).

Exactness: every output sample is computed by the same sums of the same products as in the one-shot
decode, so the stream equals it exactly wherever each conv kernel's summation order does not depend on
the length of its input.  Our Triton convs (:mod:`zonos_accel.triton.vocoder`, on with the fast ops) fix
that order per layer: on an H200 the fp16 stream equals the one-shot decode bit for bit at every push size
(a cuDNN stream is 56.6 dB from it: cuDNN picks its algorithm by length).  The torch reference matches at
118 dB in fp32 (TF32 off) and bit for bit on the CPU wherever oneDNN's order does not depend on length.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zonos.codec.autoencoder import DACAutoencoder, check_code_range, decode_precision, validate_codes
from zonos.codec.dac import DAC, DACConfig, ResidualUnit, Snake1d, conv_dtype
from zonos.cuda_graphs import NOT_CAPTURED, GraphSet
from zonos.ops.backend import REFERENCE, Backend
from zonos.ops.vocoder import Scratch
from zonos.utils import on_meta, tensor_version

__all__ = [
    "StreamingDACDecoder",
    "WeightCasts",
    "ReceptiveField",
    "receptive_field",
    "steady_state_size",
]


# ---------------------------------------------------------------------------------------------
# Streaming stages.  Each consumes the next samples of its input stream and returns the next
# samples of its output stream that are final (None when there are none yet).
# ---------------------------------------------------------------------------------------------


class WeightCasts:
    """A codec's conv weights cast for autocast streams, shared by the streaming decoders given it (an engine's:
    one copy of the decoder's ~55 M weights, 110 MB in fp16, and of the fast convs' packed forms of them, instead
    of one per decoder).

    Under autocast every conv call casts its fp32 weight and bias to fp16 anew (autocast caches the casts only of
    parameters that require grad): for a push of a few frames that re-reads the whole decoder's weights (218 MB in
    fp32) and launches a cast per tensor.  The stages get instead these copies, made current at each stream's start
    by :meth:`refresh` (in place when the weights kept their storage).  Autocast casts with the same ``.to(dtype)``,
    so the results are bit for bit those of casting in every call.
    """

    def __init__(self) -> None:
        self._copies: dict[tuple[Tensor, torch.dtype], tuple[Tensor, int, int]] = {}  # -> (copy, data_ptr, version)

    def get(self, p: Tensor, dtype: torch.dtype) -> Tensor:
        copy = self._copies.get((p, dtype))
        return p if copy is None else copy[0]

    def refresh(self, params: Sequence[Tensor], dtype: torch.dtype) -> None:
        """Make the ``dtype`` copies of ``params`` current (written on the current stream, which is then
        synchronized, so that decoders on other CUDA streams may read them)."""
        changed = False
        for p in params:
            if p.dtype in (dtype, torch.float64) or not p.is_floating_point():
                continue  # autocast passes these on as they are
            copy, ptr, version = self._copies.get((p, dtype), (None, 0, 0))
            if copy is None or copy.shape != p.shape or copy.device != p.device:
                copy, changed = p.to(dtype), True
            elif (ptr, version) != (p.data_ptr(), tensor_version(p)):
                copy.copy_(p)  # new values: decoders drop their graphs (the copy's version changed)
                changed = True
            self._copies[(p, dtype)] = (copy, p.data_ptr(), tensor_version(p))
        devices = {p.device for p in params if p.is_cuda}
        if changed and devices:
            # Decoders on other CUDA streams read the copies next: they must be written (once per weight change).
            for device in devices:
                torch.cuda.current_stream(device).synchronize()


class _Params:
    """The conv parameters as one decoder's stages hand them to the ops: the :class:`WeightCasts` copies while its
    stream is decoded under autocast, else the parameters themselves."""

    def __init__(self, casts: WeightCasts) -> None:
        self.enabled = True
        self.casts = casts
        self.dtype: torch.dtype | None = None  # the autocast dtype of the current stream, None: no casts

    def __call__(self, p: Tensor | None) -> Tensor | None:
        if self.dtype is None or p is None:
            return p
        return self.casts.get(p, self.dtype)

    def refresh(self, params: Sequence[Tensor], dtype: torch.dtype | None) -> None:
        """Make the copies current for a stream decoded under autocast to ``dtype`` (None: none)."""
        self.dtype = dtype if self.enabled else None
        if self.dtype is not None:
            self.casts.refresh(params, self.dtype)


class _Stage:
    """One layer with explicit streaming state.

    ``stride``, ``right`` and ``left`` describe its dependencies: output sample ``t`` depends on
    input samples ``floor((t - left) / stride) .. floor((t + right) / stride)``, and after ``m``
    input samples, ``stride * m - right`` output samples are final.

    The state is the attributes named in ``state_attrs``: tensors, whose shapes depend only on the
    sizes of the pushes so far, and ints.  With ``static`` set (the decoder sets it on CUDA, for its
    CUDA graphs), every state tensor is kept in a buffer of this stage that is reused for every state
    of the same attribute and shape, updated in place (:meth:`_empty`): two pushes of one size from
    states of the same shapes read and write the same addresses, and a CUDA graph captured from one
    replays the other.
    """

    stride: int = 1
    right: int = 0
    left: int = 0
    state_attrs: tuple[str, ...] = ()
    static: bool = False
    rows: int | None = None  # a bank's row capacity: its buffers hold that many rows, a push uses the leading ones
    ops: Backend = REFERENCE  # the decoder sets the codec's backend at the start of each stream
    scratch: Scratch | None = None  # and its own scratch, passed to every op call (its fast path's working memory)
    valid: Tensor | None = None  # a slab's: per row, the [lo, hi) of each push's input samples that hold signal

    def __init__(self) -> None:
        self._buffers: dict[tuple, Tensor] = {}  # (attribute, shape, dtype, device) -> fixed-address state
        self._views: dict[tuple, Tensor] = {}  # a bank's: (buffer key, rows) -> the buffer's leading rows

    def push(self, x: Tensor) -> Tensor | None:
        raise NotImplementedError

    def finish(self, x: Tensor | None) -> Tensor | None:
        """The stream's last input ``x`` (None: none) pushed, and the end of the stream (the right zero padding): all
        the output this stage still owes, in one push where it can (half the launches of a push then a flush)."""
        return None if x is None else self.push(x)

    def reset(self) -> None:
        """Forget the stream.  The buffers stay, with their addresses (captured graphs hold them) and contents:
        a push writes every buffer it reads earlier in the same stream, as it would a fresh ``new_empty``."""

    def walk(self) -> Iterator[_Stage]:
        """This stage and the stages inside it."""
        yield self

    def _empty(self, attr: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """A new state tensor for attribute ``attr``, or with ``static`` set this stage's buffer for that attribute
        and shape (the same one every time, so that pushes from states of the same shapes touch the same
        addresses)."""
        if not self.static:
            return like.new_empty(shape)
        key = self._key(attr, shape, like)
        buf = self._buffers.get(key)
        if buf is None:
            if like.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("streaming state would be allocated inside a CUDA graph capture")
            if self.rows is None:
                buf = like.new_empty(shape)
            else:  # zeros: the rows no stream holds are pushed too, and must stay finite
                buf = like.new_zeros(self.rows, *shape[1:])
            self._buffers[key] = buf
        if self.rows is None:
            return buf
        view = self._views.get((key, shape[0]))  # the same view object every time: graphs compare state by identity
        if view is None:
            view = self._views[(key, shape[0])] = buf[: shape[0]]
        return view

    def _key(self, attr: str, shape: tuple[int, ...], like: Tensor) -> tuple:
        return (attr, shape if self.rows is None else shape[1:], like.dtype, like.device)

    def state_rows(self, attr: str, value: Tensor, rows: int | None = None) -> Tensor:
        """The bank buffer that holds ``value``, a state tensor of attribute ``attr``: its leading ``rows`` rows
        (default all)."""
        return self._empty(attr, (self.rows if rows is None else rows, *value.shape[1:]), value)


def _weights(conv: nn.Module, params: _Params) -> tuple[Tensor, Tensor | None]:
    return params(conv.weight), params(conv.bias)


class _Windowed(_Stage):
    """A stage whose conv reads ``[history | new]`` windows of its input (Snake's outputs where Snake feeds it).

    The state ``window`` is the last window (initially the left padding's zeros); its last ``context`` samples
    (fewer at the start of a stream) are the next window's history.  A push of ``n`` samples makes the next
    window in one ``sequence_tail``: those samples shifted to the front of a ``history + n`` buffer (in place when
    it is the same buffer: every steady push of a size), and Snake's outputs for the new samples behind them, in
    the conv's dtype.  The conv then reads one tensor.
    """

    state_attrs = ("window",)
    context = 0  # history samples a window keeps
    initial = 0  # zeros before the first input
    unfold: tuple[int, int] | None = None  # (kernel, dilation) of a stride-1 conv: sequence_tail's hint

    def __init__(self, conv: nn.Module, params: _Params, snake: Snake1d | None) -> None:
        super().__init__()
        self.conv, self.params, self.snake = conv, params, snake

    def reset(self) -> None:
        super().reset()
        self.window: Tensor | None = None

    def _kept(self) -> int:
        """How many samples of the last window the next one keeps."""
        return min(self.initial if self.window is None else self.window.shape[-1], self.context)

    def _next_window(
        self, x: Tensor, raw: tuple[Tensor, int, Tensor] | None = None, unfold: tuple[int, ...] | None = None
    ) -> Tensor:
        """The window of ``x``'s samples: the kept history, then Snake's outputs (or ``x``, cast).  ``raw``:
        ``sequence_tail``'s, kept in the same call; ``unfold``: its hint, if not :attr:`unfold`."""
        last = self.window
        if last is None:
            last = x.new_zeros(*x.shape[:2], self.initial, dtype=conv_dtype(x, self.conv.weight))
        length = self._kept() + x.shape[-1]
        window = self._empty("window", (*x.shape[:2], length), last)
        alpha = None if self.snake is None else self.snake.alpha
        unfold = unfold or self.unfold
        self.window = self.ops.sequence_tail(
            last, x, length, out=window, alpha=alpha, unfold=unfold, raw=raw, scratch=self.scratch, valid=self.valid
        )
        return self.window


class _Conv(_Windowed):
    """A stride-1 ``nn.Conv1d`` with zero padding ``p`` on both sides, after an optional Snake, with an optional
    tanh after it: the conv over each window emits every output the window makes final (none while the window
    is shorter than the kernel)."""

    def __init__(self, conv: nn.Conv1d, params: _Params, snake: Snake1d | None = None, tanh: bool = False) -> None:
        (k,), (d,), (s,) = conv.kernel_size, conv.dilation, conv.stride
        pad = conv.padding
        if s != 1 or conv.groups != 1 or not isinstance(pad, tuple) or conv.padding_mode != "zeros":
            raise ValueError(f"unsupported conv for streaming: {conv}")
        super().__init__(conv, params, snake)
        self.tanh = tanh
        self.dilation = d
        self.context = (k - 1) * d  # input samples one output spans, minus one
        self.unfold = (k, d)
        self.initial = self.left = pad[0]
        self.right = self.context - pad[0]
        self.reset()

    def _conv(self, window: Tensor, **kwargs) -> Tensor | None:
        if window.shape[-1] <= self.context:
            return None
        weight, bias = _weights(self.conv, self.params)
        return self.ops.conv1d(
            window, weight, bias, dilation=self.dilation, dtype=window.dtype, scratch=self.scratch, **kwargs
        )

    def push(self, x: Tensor) -> Tensor | None:
        return self._conv(self._next_window(x), tanh=self.tanh)

    def finish(self, x: Tensor | None) -> Tensor | None:
        like = self.window if x is None else x
        if like is None:  # nothing was pushed
            return None
        pad = like.new_zeros(*like.shape[:2], self.right)  # the right padding's zeros (Snake maps zero to zero)
        out = self.push(pad if x is None else torch.cat([x, pad], dim=-1))
        for attr in self.state_attrs:  # the stream is over
            setattr(self, attr, None)
        return out


class _ResUnit(_Conv):
    """A :class:`~zonos.codec.dac.ResidualUnit`: ``x + conv2(snake2(conv1(snake1(x))))``.

    conv1 streams as a :class:`_Conv`; the kernel-1 conv2 adds the residual as it stores, reading it from ``raw``:
    the raw inputs whose conv1 output was not final after the last push (conv1's window samples from ``3 d`` on:
    its centre tap), then this push's.  ``raw`` is kept by the same ``sequence_tail`` as conv1's window (one
    launch for both on the Triton path), and the first ``n`` samples that conv2 reads of it are those of its
    ``n`` outputs.
    """

    state_attrs = ("window", "raw")

    def __init__(self, unit: ResidualUnit, params: _Params) -> None:
        super().__init__(unit.conv1, params, unit.snake1)
        self.unit = unit

    def reset(self) -> None:
        super().reset()
        self.raw: Tensor | None = None

    def push(self, x: Tensor) -> Tensor | None:
        last = self.raw if self.raw is not None else x.new_zeros(*x.shape[:2], 0)
        length = self._kept() - self.left + x.shape[-1]  # the inputs still pending, then x
        raw = self._empty("raw", (*x.shape[:2], length), last)
        window = self._next_window(x, raw=(last, length, raw))
        self.raw = raw
        h = self._conv(window, alpha=self.unit.snake2.alpha)  # snake2(conv1(...))
        if h is None:
            return None
        weight, bias = _weights(self.unit.conv2, self.params)
        return self.ops.conv1d(h, weight, bias, residual=raw, dtype=h.dtype, scratch=self.scratch)


class _ConvTranspose(_Windowed):
    """``nn.ConvTranspose1d`` (stride ``s``, kernel ``k >= s``, padding ``p``), after an optional Snake.

    Input ``i`` adds ``k`` samples to the uncropped output, at ``i * s .. i * s + k - 1``, so uncropped sample
    ``u`` is a sum over inputs ``floor((u - k) / s) + 1 .. floor(u / s)``: once ``m`` inputs are in, samples
    ``< m * s`` are final.  Each window holds the last ``h = ceil(k / s) - 1`` inputs (zeros before the
    stream) and the new ones, and the push keeps the samples from the new inputs' first on: each final sample
    is then one conv sum, bias included, over the same inputs as in the one-shot decode, at the cost of
    recomputing ``h`` inputs per call (one for the DAC: ~3% of the decoder's work at 1-frame pushes).  The
    cropped output is uncropped sample ``t + p``: ``p`` samples are dropped at the start and, at flush, at the
    end.
    """

    state_attrs = ("window", "to_skip")

    def __init__(self, conv: nn.ConvTranspose1d, params: _Params, snake: Snake1d | None = None) -> None:
        (k,), (s,), (p,), (d,) = conv.kernel_size, conv.stride, conv.padding, conv.dilation
        (op,) = conv.output_padding
        if d != 1 or op != 0 or conv.groups != 1 or k < s or k - s < p:
            raise ValueError(f"unsupported transposed conv for streaming: {conv}")
        super().__init__(conv, params, snake)
        self.stride, self.kernel, self.padding = s, k, p
        self.context = self.initial = -(-k // s) - 1  # history inputs
        self.right = p
        self.left = k - s - p
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.to_skip = self.padding

    def _span(self, end: int) -> tuple[int, int]:
        """(start, length) of the uncropped samples ``h s + to_skip .. end - 1``: those a call up to ``end`` makes."""
        first = self.context * self.stride
        drop = min(self.to_skip, max(end - first, 0))
        return first + drop, end - first - drop

    def _conv(self, window: Tensor, end: int) -> Tensor | None:
        """Uncropped samples ``h s + to_skip .. end - 1`` over ``window`` (None: none), skipping the crop."""
        start, length = self._span(end)
        self.to_skip -= start - self.context * self.stride
        if length <= 0:
            return None
        weight, bias = _weights(self.conv, self.params)
        return self.ops.conv_transpose1d(
            window,
            weight,
            bias,
            stride=self.stride,
            start=start,
            length=length,
            dtype=window.dtype,
            scratch=self.scratch,
        )

    def push(self, x: Tensor) -> Tensor | None:
        if x.shape[-1] == 0:
            return None
        end = (x.shape[-1] + self.context) * self.stride
        start, length = self._span(end)
        hint = (self.kernel, self.stride, start, length) if length > 0 else None
        return self._conv(self._next_window(x, unfold=hint), end)

    def finish(self, x: Tensor | None) -> Tensor | None:
        if self.context == 0:  # k == s (so no crop at the end): every sample is final at its push
            out = super().finish(x)
        else:
            # Every sample of the window's inputs, the last ones' past the final ones too, minus the crop at the end.
            if x is not None and x.shape[-1]:
                end = self._end(self.context + x.shape[-1])
                start, length = self._span(end)
                window = self._next_window(x, unfold=(self.kernel, self.stride, start, length) if length > 0 else None)
            else:
                window = None if self.window is None else self.window[..., self.window.shape[-1] - self.context :]
            out = None if window is None else self._conv(window, self._end(window.shape[-1]))
        self.window = None
        return out

    def _end(self, inputs: int) -> int:
        """The uncropped length of ``inputs`` inputs' output, minus the crop at the end."""
        return (inputs - 1) * self.stride + self.kernel - self.padding


def _run(stages: Sequence[_Stage], x: Tensor | None) -> Tensor | None:
    for stage in stages:
        if x is None:
            return None
        x = stage.push(x)
    return x


def _flush(stages: Sequence[_Stage]) -> Tensor | None:
    """End the stream: each stage turns its last input and its padding into output."""
    x: Tensor | None = None
    for stage in stages:
        x = stage.finish(x)
    return x


def _decoder_stages(dac: DAC, params: _Params | None = None) -> list[_Stage]:
    """Streaming stages sharing the modules (hence weights) of ``dac.decoder``, in forward order: the calls
    of the one-shot :class:`~zonos.codec.dac.Decoder` on ``[history | new]`` windows."""
    params = params or _Params(WeightCasts())
    dec = dac.decoder
    stages: list[_Stage] = [_Conv(dec.conv1, params)]
    for block in dec.block:
        stages.append(_ConvTranspose(block.conv_t1, params, block.snake1))
        stages += [_ResUnit(unit, params) for unit in (block.res_unit1, block.res_unit2, block.res_unit3)]
    stages.append(_Conv(dec.conv2, params, dec.snake1, tanh=True))
    return stages


# ---------------------------------------------------------------------------------------------
# Receptive field
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceptiveField:
    """Which code frames an output sample depends on.

    Output sample ``t`` depends on frames ``floor((t - left_context_samples) / hop_length)`` to
    ``floor((t + lookahead_samples) / hop_length)``.
    """

    hop_length: int
    sampling_rate: int
    lookahead_samples: int
    left_context_samples: int

    @property
    def lookahead_frames(self) -> int:
        """Most frames after its own that a sample depends on (``ceil(lookahead / hop)``)."""
        return math.ceil(self.lookahead_samples / self.hop_length)

    @property
    def left_context_frames(self) -> int:
        """Most frames before its own that a sample depends on."""
        return math.ceil(self.left_context_samples / self.hop_length)

    @property
    def lookahead_ms(self) -> float:
        """The algorithmic latency of streaming decoding, in milliseconds."""
        return 1000.0 * self.lookahead_samples / self.sampling_rate

    def samples_ready(self, frames: int) -> int:
        """Output samples that are final once ``frames`` frames have been pushed (before flush)."""
        return max(0, self.hop_length * frames - self.lookahead_samples)


def _compose(stages: Sequence[_Stage], hop_length: int, sampling_rate: int) -> ReceptiveField:
    # Walk from the output back to the frames, composing t -> floor((t + a) / s) maps:
    # floor((floor((t + A) / S) + a) / s) == floor((t + A + a * S) / (S * s)).
    right = left = 0
    scale = 1
    for stage in reversed(stages):
        right += stage.right * scale
        left += stage.left * scale
        scale *= stage.stride
    assert scale == hop_length, (scale, hop_length)
    return ReceptiveField(hop_length, sampling_rate, right, left)


def receptive_field(config: DACConfig | None = None) -> ReceptiveField:
    """Receptive field of the DAC decoder for ``config`` (default: the 44.1 kHz model).

    For ``descript/dac_44khz``: ``lookahead_samples == left_context_samples == 4757``
    (``lookahead_frames == left_context_frames == 10``, 107.9 ms of lookahead).
    """
    config = config or DACConfig()
    with on_meta():  # only the layer shapes are needed
        dac = DAC(config)
    return _compose(_decoder_stages(dac), config.hop_length, config.sampling_rate)


def steady_state_size(config: DACConfig | None = None, chunk_frames: int = 16) -> int:
    """Values one stream's decoder state holds between steady pushes of ``chunk_frames`` frames (default config:
    the 44.1 kHz model): each layer's window (its kept history and the last push's samples) and each residual unit's
    raw inputs. For the 44.1 kHz model at 16 frames: 14,669,728 (28 MiB in fp16); memory planning counts it per
    stream."""
    config = config or DACConfig()
    with on_meta():  # only the layer shapes are needed
        dac = DAC(config)
    size, rate = 0, 1  # input samples per frame of the stage at hand
    for stage in _decoder_stages(dac):
        samples = stage.context + rate * chunk_frames
        size += stage.conv.in_channels * samples
        if isinstance(stage, _ResUnit):
            size += stage.conv.in_channels * (samples - stage.left)
        if isinstance(stage, _ConvTranspose):
            rate *= stage.stride
    return size


# ---------------------------------------------------------------------------------------------
# Public decoder
# ---------------------------------------------------------------------------------------------

_MAX_GRAPHS = 64  # per decoder; past that, pushes of new keys stay eager


@dataclass
class _Captured:
    """What a captured push (or flush) reads and leaves: the static input the codes are copied into before each
    replay, the audio it overwrites, and the stages' state attributes after it with their graph key."""

    input: Tensor | None  # codes [B, 9, n] or latent [B, hidden, n]
    output: Tensor | None  # audio [B, 1, m] float32, overwritten by each replay (and other graphs')
    after: list[tuple[_Stage, dict]]
    after_key: tuple  # :meth:`StreamingDACDecoder._state_key` of ``after``


class StreamingDACDecoder:
    """Decode DAC codes chunk by chunk; the outputs concatenate to the one-shot decode.

    Example::

        dec = StreamingDACDecoder(autoencoder)
        for chunk in code_chunks:          # [B, 9, n] each, any n >= 0
            play(dec.push(chunk))          # [B, 1, m]; m == 0 until ~10 frames are in
        play(dec.flush())                  # the last samples

    After ``n`` frames in total, ``receptive_field.samples_ready(n) == max(0, 512 n - 4757)``
    samples have been returned.  It runs on the device and dtype of the codec's weights, with the
    decoding precision of :meth:`DACAutoencoder.decode` (fp16 autocast on CUDA) unless
    ``fp16_autocast`` says otherwise.  Call :meth:`reset` to start a new stream (e.g. after
    cancelling one).

    **CUDA graphs** (``cuda_graphs=True``, CUDA only).  The stages keep each state tensor in a buffer
    of theirs per shape, so a push's addresses and shapes follow from the shapes of the state before
    it and its own size: pushes and the flush are captured into CUDA graphs keyed by the state's
    shapes (and int values), the batch and push sizes, the input kind and the numeric mode.  (Once
    every layer holds its full context, the state's shapes depend only on the previous push's size:
    repeated pushes of one size share a key.)  The second time a key occurs its push runs eagerly
    (the warm-up) and is then captured, by the rules of :mod:`zonos.cuda_graphs` that the engine's
    graphs follow too; from the third on it is replayed: the codes copied in, one graph launch, the
    audio copied out.  The graphs run the eager push's kernels on the same data, so they return the same samples.
    :meth:`reset` keeps them (and the state buffers they address), so later streams of the same
    schedule replay every push; they are dropped when the codec's weights change or move.  The
    stages, run eagerly on the CPU and for the first occurrences, are the reference.

    ``casts``: the :class:`WeightCasts` to take autocast weight copies from, shared with other decoders of the same
    codec (default: this decoder's own).
    """

    def __init__(
        self,
        codec: DACAutoencoder | DAC,
        fp16_autocast: bool | None = None,
        cuda_graphs: bool = True,
        casts: WeightCasts | None = None,
    ) -> None:
        self.dac: DAC = codec.dac if isinstance(codec, DACAutoencoder) else codec
        self.fp16_autocast = fp16_autocast
        self.cuda_graphs = cuda_graphs
        config = self.dac.config
        self._params = _Params(casts if casts is not None else WeightCasts())
        self._rows: int | None = None  # set by a VocoderSlab: the rows its state buffers hold
        self._scratch = Scratch()  # the ops' working memory for this decoder's calls alone
        self._stages = _decoder_stages(self.dac, self._params)
        self._conv_params = [
            t for s in self._all_stages() if hasattr(s, "conv") for t in (s.conv.weight, s.conv.bias) if t is not None
        ]
        self.receptive_field: ReceptiveField = _compose(self._stages, config.hop_length, config.sampling_rate)
        self.graphs = GraphSet(capture_at=2, max_graphs=_MAX_GRAPHS)  # a key's second push is captured
        self._graph_weights: tuple = ()  # the weights' (address, version) when the graphs were captured
        self._stream: torch.cuda.Stream | None = None  # where the state was last touched
        self._code_bounds: Tensor | None = None  # [min, max] of the CUDA codes pushed, 0 included
        self._state_key_cache: tuple | None = None
        self.reset()

    def reset(self) -> None:
        """Forget all state; the next push starts a new stream."""
        self._order_streams()
        for stage in self._stages:
            stage.reset()
        self._state_key_cache = None
        if self._code_bounds is not None:
            self._code_bounds.zero_()
        self._batch: int | None = None
        self._finished = False
        self.frames_pushed = 0
        self.samples_emitted = 0

    @property
    def _device(self) -> torch.device:
        return next(self.dac.parameters()).device

    def push(self, codes: Tensor) -> Tensor:
        """Feed the next code frames ``[B, n_codebooks, n]``; returns the newly final audio ``[B, 1, m]``.

        Code values outside ``0 .. codebook_size - 1`` raise ``ValueError``: at once for codes on the CPU; for
        codes on a GPU, at :meth:`flush` (reading them here would make the CPU wait for the GPU at every push),
        and the audio returned until then is invalid (the lookup clamps them)."""
        config = self.dac.config
        device = self._device
        codes = validate_codes(codes, config.n_codebooks, config.codebook_size, values=not codes.is_cuda)
        codes = codes.to(device)
        with torch.no_grad(), decode_precision(device, self.fp16_autocast):
            self._start(codes.shape[0], device)
            return self._push("codes", codes)

    def push_latent(self, latent: Tensor) -> Tensor:
        """Like :meth:`push`, for continuous latent frames ``[B, hidden_size, n]``."""
        if latent.dim() != 3 or latent.shape[1] != self.dac.config.hidden_size:
            raise ValueError(f"latent must be [B, {self.dac.config.hidden_size}, n]; got {tuple(latent.shape)}")
        param = next(self.dac.parameters())
        latent = latent.to(param.device, param.dtype)
        with torch.no_grad(), decode_precision(param.device, self.fp16_autocast):
            self._start(latent.shape[0], param.device)
            return self._push("latent", latent)

    def flush(self) -> Tensor:
        """End the stream and return the remaining audio ``[B, 1, r]`` (the right-padded tail).

        Raises ``ValueError`` if CUDA codes pushed to this stream held values outside the codebook (see
        :meth:`push`); this is where they are read, once per stream."""
        if self._finished:
            raise RuntimeError("the stream was already flushed; call reset() to start a new one")
        self._order_streams()
        if self._code_bounds is not None:
            lo, hi = self._code_bounds.tolist()
            try:
                check_code_range(lo, hi, self.dac.config.codebook_size)
            except ValueError as err:
                raise ValueError(f"this stream's audio is invalid, call reset() to start a new one: {err}") from None
        with torch.no_grad(), decode_precision(self._device, self.fp16_autocast):
            out = self._call("flush", None) if self.frames_pushed else None
        self._finished = True
        return self._finish(out)

    # -- internals -----------------------------------------------------------------------------

    def _all_stages(self) -> Iterator[_Stage]:
        for stage in self._stages:
            yield from stage.walk()

    def _start(self, batch: int, device: torch.device) -> None:
        """Checks before a push; at a stream's first push, set up what the whole stream uses."""
        if self._finished:
            raise RuntimeError("the stream was flushed; call reset() before pushing again")
        self._order_streams()
        if self._batch is not None:
            if batch != self._batch:
                raise ValueError(f"batch size changed mid-stream ({self._batch} -> {batch}); call reset() first")
            return
        self._batch = batch
        static = self._graphs_on(device) or self._rows is not None
        for stage in self._all_stages():
            stage.static = static
            stage.rows = self._rows
            stage.ops = self.dac.ops
            stage.scratch = self._scratch
        autocast = torch.is_autocast_enabled(device.type)
        self._params.refresh(self._conv_params, torch.get_autocast_dtype(device.type) if autocast else None)
        if static:
            params = [*self.dac.decoder.parameters(), *self.dac.quantizer.parameters()]
            # Moved or re-cast, the graphs would read freed memory; changed in place, data derived from the weights
            # by the ops (the Triton convs' packed copies) would be stale in replays.
            weights = tuple((p.data_ptr(), tensor_version(p)) for p in [*params, *map(self._params, self._conv_params)])
            if weights != self._graph_weights:
                self.graphs.drop(forget=False)  # the keys recur: their next pushes capture again
                self._graph_weights = weights

    def _graphs_on(self, device: torch.device) -> bool:
        return self.cuda_graphs and device.type == "cuda"

    def _order_streams(self) -> None:
        """Order this call's work on the state after the last call's, if that ran on another CUDA
        stream (an earlier request's side stream, say)."""
        if self._stream is None:
            return
        stream = torch.cuda.current_stream(self._stream.device)
        if stream != self._stream:
            stream.wait_stream(self._stream)
            self._stream = stream

    def _push(self, kind: str, x: Tensor) -> Tensor:
        if x.shape[-1] == 0:
            return self._finish(None)
        out = self._call(kind, x)
        self.frames_pushed += x.shape[-1]
        return self._finish(out)

    def _forward(self, kind: str, x: Tensor | None) -> Tensor | None:
        """The eager push of codes or latent frames ``x``, or the flush: the stages' new output."""
        self._state_key_cache = None  # the state changes
        if kind == "flush":
            return _flush(self._stages)
        return _run(self._stages, self._latent(x) if kind == "codes" else x)

    def _latent(self, codes: Tensor) -> Tensor:
        """The latent of ``codes``.  CUDA codes are clamped into the codebook and their range folded into
        ``_code_bounds`` for :meth:`flush` to check: no host sync (one launch in the push's graph with Triton)."""
        if not codes.is_cuda:
            return self.dac.codes_to_latent(codes)  # checked by push
        if self._code_bounds is None or self._code_bounds.device != codes.device:
            self._code_bounds = torch.zeros(2, dtype=torch.long, device=codes.device)  # eager before any capture
        return self.dac.codes_to_latent(codes, bounds=self._code_bounds)

    @property
    def graph_captures(self) -> int:
        return self.graphs.captures

    @property
    def graph_replays(self) -> int:
        return self.graphs.replays

    def _call(self, kind: str, x: Tensor | None) -> Tensor | None:
        """:meth:`_forward`, replayed from a CUDA graph where one was captured for this state and input."""
        device = self._device
        if not self._graphs_on(device):
            return self._forward(kind, x)
        if self._stream is None:
            self._stream = torch.cuda.current_stream(device)
        key = self._graph_key(kind, x)
        captured = self.graphs.replay(key, None if x is None else lambda c: c.input.copy_(x))
        if captured is NOT_CAPTURED:
            if not self.graphs.due(key):
                return self._forward(kind, x)  # (the first run of a key may be a one-off)
            return self._eager_then_capture(key, kind, x)
        self._restore(captured.after)
        self._state_key_cache = captured.after_key
        # Other graphs of the pool may reuse the output's memory: hand out a copy.
        return None if captured.output is None else captured.output.clone()

    def _graph_key(self, kind: str, x: Tensor | None) -> tuple:
        """What a captured push or flush is valid for: the state's shapes (each tensor's is the buffer a static
        stage keeps it in) and int values, the input's shape and the numeric mode."""
        return (
            kind,
            self.dac.ops,  # a graph replays the kernels of the backend it captured
            self._state_key(),
            self._batch,
            None if x is None else (tuple(x.shape), x.dtype),
            self._device,
            torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cuda"),
            self._params.dtype,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.deterministic,
            torch.backends.cuda.matmul.allow_tf32,
        )

    def _state_key(self) -> tuple:
        """The state's part of the graph key, cached until a push changes the state (a replay knows it)."""
        if self._state_key_cache is None:
            self._state_key_cache = tuple(
                tuple(v.shape) if isinstance(v, Tensor) else v
                for stage in self._all_stages()
                for v in (getattr(stage, a) for a in stage.state_attrs)
            )
        return self._state_key_cache

    def _snapshot(self) -> list[tuple[_Stage, dict]]:
        return [(s, {a: getattr(s, a) for a in s.state_attrs}) for s in self._all_stages() if s.state_attrs]

    @staticmethod
    def _restore(snapshot: list[tuple[_Stage, dict]]) -> None:
        for stage, values in snapshot:
            vars(stage).update(values)

    def _eager_then_capture(self, key: tuple, kind: str, x: Tensor | None) -> Tensor | None:
        """Run the push eagerly (the warm-up; its output is returned), then capture it from the same state as
        ``key``'s graph (which runs nothing: the state tensors keep the values of the eager run)."""
        before = self._snapshot()
        out = self._forward(kind, x)
        after = self._snapshot()
        self._restore(before)
        static_in = None if x is None else x.clone()

        def push() -> _Captured:
            static_out = self._forward(kind, static_in)
            return _Captured(static_in, None if static_out is None else static_out.float(), after, ())

        captured = self.graphs.capture(key, push, self._device)
        captured_after = self._snapshot()
        self._restore(after)
        if captured is not NOT_CAPTURED:
            if any(
                a is not b and not (isinstance(a, int) and a == b)
                for (_, va), (_, vb) in zip(after, captured_after)
                for a, b in zip(va.values(), vb.values())
            ):
                raise RuntimeError("the captured push left another state than the eager one (a bug)")
            captured.after_key = self._state_key()  # the state is `after`
        return out

    def _finish(self, out: Tensor | None) -> Tensor:
        if out is None:
            return torch.zeros(self._batch or 0, 1, 0, device=self._device)
        self.samples_emitted += out.shape[-1]
        return out.float()
