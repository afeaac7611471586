"""Many streams' vocoders as the rows of one streaming decoder, every row pushed at every push.

A :class:`VocoderSlab` holds ``rows`` streams' decoder states at fixed addresses, each in the steady shape of pushes
of ``frames`` frames, and one :meth:`VocoderSlab.push` decodes the next ``frames`` frames of every row (one CUDA graph
per bucket of rows, :func:`~zonos.utils.batch_buckets`). No stream needs a decoder of its own at its start or its
end: a row counts as a stream that has run since long before its first frame with silence in every layer, and each
push hands every layer a per-row range of its new input samples that hold signal (``sequence_tail``'s ``valid``),
the rest read as zeros.

Why that is exact: the one-shot decoder pads each conv's input with zeros ("same" padding; Snake maps zero to zero),
and a layer's input outside the stream (before its start, after its end) is exactly that padding in the slab. A row's
state is each layer's last inputs, so a new stream's row is all zeros (:meth:`VocoderSlab.admit`), and the zeros after
its end are its flush: pushes go on until its last sample is out. Every layer sums the same products as the one-shot
decode for each output sample inside the stream; samples outside it are computed too and dropped.

Positions: row ``r``'s push covers its stream's frames ``first[r] .. first[r] + frames - 1`` (negative before the
stream starts, which is how a stream joins between pushes), and layer ``s`` receives its input samples
``first[r] * U_s - D_s + [0, frames * U_s)``: ``U_s`` input samples per frame, ``D_s`` samples of lag behind the
frames (the right context of the layers before it). The audio out covers samples ``first[r] * hop - lookahead + [0,
frames * hop)``; those in ``[0, end[r] * hop)`` are the stream's (:meth:`VocoderSlab.samples`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from zonos.codec.autoencoder import DACAutoencoder, decode_precision
from zonos.codec.dac import DAC
from zonos.codec.streaming import StreamingDACDecoder, WeightCasts
from zonos.ops.sampler import to_device
from zonos.utils import batch_buckets

OPEN_END = 2**40  # a row's end (in frames) while its stream's length is not known


class VocoderSlab:
    """``rows`` streams decoded together, ``frames`` frames per push (see the module docstring).

    ``first`` and ``end`` (device int64, one per row) are a row's first frame at its next push and its stream's frame
    count (:data:`OPEN_END` until known); :meth:`admit` and :meth:`set_end` write them, :meth:`push` advances
    ``first`` by ``frames``, and callers may lower ``end`` with device ops (e.g. at an EOS found in the codes).
    """

    def __init__(
        self,
        codec: DACAutoencoder | DAC,
        rows: int,
        frames: int,
        fp16_autocast: bool | None = None,
        cuda_graphs: bool = True,
        casts: WeightCasts | None = None,
    ) -> None:
        if rows < 1 or frames < 1:
            raise ValueError(f"a slab needs rows >= 1 and frames >= 1; got rows={rows}, frames={frames}")
        self.decoder = StreamingDACDecoder(codec, fp16_autocast, cuda_graphs, casts)
        self.decoder._rows = rows
        self.rows, self.frames = rows, frames
        self.buckets = batch_buckets(rows)
        field = self.decoder.receptive_field
        self.hop, self.lookahead = field.hop_length, field.lookahead_samples
        device = self.decoder._device
        self.first = torch.zeros(rows, dtype=torch.int64, device=device)
        self.end = torch.full((rows,), OPEN_END, dtype=torch.int64, device=device)
        # Per layer: input samples per frame and lag behind the frames (composed as each layer emits them).
        rates, lags, rate, lag = [], [], 1, 0
        for stage in self.decoder._stages:
            rates.append(rate)
            lags.append(lag)
            rate, lag = rate * stage.stride, lag * stage.stride + stage.right
        if (rate, lag) != (self.hop, self.lookahead):
            raise AssertionError(f"layer lags compose to {(rate, lag)}, not the decoder's {(self.hop, self.lookahead)}")
        self._rates = torch.tensor(rates, dtype=torch.int64, device=device)
        self._lags = torch.tensor(lags, dtype=torch.int64, device=device)
        self._valid = torch.zeros(rows, len(rates), 2, dtype=torch.int64, device=device)
        self._valid_views: dict[int, list[Tensor]] = {}  # bucket -> per layer (the same objects every push)
        self.pushes = 0
        self._steady(device)

    def _steady(self, device: torch.device) -> None:
        """Give every layer its steady state: the shapes of a stream's state between pushes of ``frames`` frames
        (from a decoder of one row run on silence), each buffer ``rows`` rows of zeros."""
        probe = StreamingDACDecoder(self.decoder.dac, self.decoder.fp16_autocast, cuda_graphs=False)
        codes = torch.zeros(1, self.decoder.dac.config.n_codebooks, self.frames, dtype=torch.long, device=device)
        before = None
        while True:  # past the lookahead, two pushes in a row leave the same shapes
            probe.push(codes)
            key = _shapes(probe)
            if key == before:
                break
            before = key
        bank = self.decoder
        with torch.no_grad(), decode_precision(device, bank.fp16_autocast):
            bank._start(1, device)
            for (mine, attr), (theirs, _) in zip(_states(bank), _states(probe)):
                value = getattr(theirs, attr)
                if isinstance(value, Tensor):
                    value = mine.state_rows(attr, value).zero_()
                setattr(mine, attr, value)
        self._buffers = [getattr(mine, attr) for mine, attr in _states(bank) if isinstance(getattr(mine, attr), Tensor)]

    def admit(self, row: int, first: int, end: int = OPEN_END) -> None:
        """Start a stream in ``row``: silence in every layer, its next push covering frames ``first ..``
        (``first < 0``: it starts within that push), ``end`` frames long (:data:`OPEN_END`: not known yet). Runs on
        the current stream, like the pushes."""
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} is not one of the slab's {self.rows}")
        self._refresh()
        with torch.no_grad():
            torch._foreach_zero_([b[row] for b in self._buffers])
            values = to_device([first, end], torch.int64, self.first.device)  # pinned: the host does not wait
            self.first[row : row + 1].copy_(values[:1])
            self.end[row : row + 1].copy_(values[1:])

    def _refresh(self) -> None:
        """What a decoder sets up at a stream's start, at each admission: the codec's current backend, weight casts
        and graphs (dropped when the weights changed)."""
        bank = self.decoder
        batch, bank._batch = bank._batch, None
        device = bank._device
        with torch.no_grad(), decode_precision(device, bank.fp16_autocast):
            bank._start(batch, device)

    def set_end(self, row: int, end: int) -> None:
        """Row ``row``'s stream ends after ``end`` frames (if not earlier)."""
        value = to_device([end], torch.int64, self.end.device)
        torch.minimum(self.end[row : row + 1], value, out=self.end[row : row + 1])

    def bucket(self, rows: int) -> int:
        """The rows a push of the first ``rows`` rows computes."""
        return next(b for b in self.buckets if b >= rows)

    def push(self, codes: Tensor) -> Tensor:
        """Decode frames ``first .. first + frames - 1`` of rows ``0 .. n - 1`` (``codes`` [n, 9, frames], any valid
        codes where a row's frames lie outside its stream); returns their audio ``[n, 1, frames * hop]``, samples
        ``first * hop - lookahead ..`` of each row's stream (:meth:`samples` says which are the stream's)."""
        n = codes.shape[0]
        if codes.dim() != 3 or codes.shape[-1] != self.frames or not 0 < n <= self.rows:
            raise ValueError(f"a slab push takes [1..{self.rows}, 9, {self.frames}] codes; got {tuple(codes.shape)}")
        b = self.bucket(n)
        if b > n:
            codes = torch.cat([codes, codes.new_zeros(b - n, *codes.shape[1:])])
        bank = self.decoder
        with torch.no_grad():
            for mine, attr in _states(bank):
                value = getattr(mine, attr)
                if isinstance(value, Tensor):
                    setattr(mine, attr, mine.state_rows(attr, value, b))
            bank._batch = b
            bank._state_key_cache = None
            views = self._valid_views.get(b)
            if views is None:
                views = self._valid_views[b] = [self._valid[:b, i] for i in range(len(bank._stages))]
            self._layer_ranges(b)
            for stage, view in zip(bank._stages, views):
                stage.valid = view
            audio = bank.push(codes)[:n]
            self.first[:b] += self.frames
        self.pushes += 1
        return audio

    def _layer_ranges(self, b: int) -> None:
        """Each layer's ``valid`` ranges for the next push of ``b`` rows: its new input samples that lie inside the
        stream, ``[0, end * U)`` in its positions ``first * U - D + i``."""
        start = self.first[:b, None] * self._rates - self._lags  # (b, layers): position of the push's first input
        n = self.frames * self._rates
        lo = (-start).clamp(min=0)
        hi = torch.minimum(self.end[:b, None] * self._rates - start, n).clamp(min=0)
        self._valid[:b].copy_(torch.stack([torch.minimum(lo, n), hi], dim=-1))

    def samples(self, first: int, end: int) -> tuple[int, int, int]:
        """For a push from frame ``first`` of a row whose stream has ``end`` frames: ``(start, stop, position)``,
        the stream's samples ``[start, stop)`` in its audio, which are the audio's ``[start - position, stop -
        position)``."""
        position = first * self.hop - self.lookahead
        stop = min(position + self.frames * self.hop, end * self.hop)
        start = max(position, 0)
        return start, max(stop, start), position

    def drained(self, first: int, end: int) -> bool:
        """Whether a row whose next push starts at frame ``first`` has put out every sample of its ``end`` frames."""
        return first * self.hop - self.lookahead >= end * self.hop


def _states(decoder: StreamingDACDecoder):
    """Every (stage, state attribute) of ``decoder``, in the same order for every decoder of one codec."""
    for stage in decoder._all_stages():
        for attr in stage.state_attrs:
            yield stage, attr


def _shapes(decoder: StreamingDACDecoder) -> tuple:
    return tuple(tuple(v.shape) if isinstance(v, Tensor) else v for v in (getattr(s, a) for s, a in _states(decoder)))
