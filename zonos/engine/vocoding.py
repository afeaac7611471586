"""Streams' audio from one vocoder slab: the frames of every batch-1 stream decoded together, one push per tick.

With the engine's ``vocoder_batching`` (the default), a stream of batch 1 on the engine's own vocoder (not one
handed in, as :mod:`zonos.longform` does) has the :class:`~zonos.codec.slab.VocoderSlab` row of its slot for its
whole life. Every ``frames`` engine steps (a *tick*), one push decodes the last ``frames`` complete frames of every
such stream, and its audio, its codes and the rows' stream ends go to pinned host memory in one copy; the host hands
the chunks out once that copy's event has completed. Between ticks nothing runs on the host per stream, no tick
waits for the GPU, and no stream needs a decoder of its own at its start or its end.

Frames: at the tick after engine step ``s``, row ``r`` pushes frames ``K - frames .. K - 1`` of its stream, ``K``
its complete frames then (its slot's offset - 8, less the audio prefix's frames when those are not emitted: the
stream starts after them, as a stream alone does). The slab advances the row's first frame by ``frames`` per push, so
after the stream's end (an EOS, found in the pushed codes on the device, its length, or where its callback stopped
it) the pushes go on, past the end, which reads as silence, until its last sample is out: then the slot is free.
The first tick of an idle slab is placed so that its first stream's first audio comes at the first push that can
hold it (its 10th complete frame).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from zonos.codebook_pattern import N_CODEBOOKS
from zonos.codec.slab import OPEN_END, VocoderSlab
from zonos.codec.streaming import WeightCasts, receptive_field
from zonos.streaming import AudioChunk, playable

RING = 8  # pinned host buffers the ticks' copies rotate through (a tick's is read before it is reused)
# A stream's first chunk holds the audio that plays for this many of the recent spacings between ticks, so a player
# that starts on it does not run dry before the next tick's audio (the spacing grows with the load: 4 steps of
# 2 ms alone, of 8 ms beside 40 streams). docs/BENCHMARKS.md, decisions: FIRST_AUDIO_TICKS
FIRST_AUDIO_TICKS = 1.25
# A chunk being gathered goes out before its size once the audio handed out before it plays for less than this many
# recent tick spacings: gathering (a 16-frame chunk waits 4 pushes) must not let a player run dry while the next
# pushes are delayed (a join's prefill takes 6-15 ms of GPU). docs/BENCHMARKS.md, decisions: RESERVE_TICKS
RESERVE_TICKS = 2.0


@dataclass
class _Tick:
    """A push on its way to the host: its copy's event, the pinned buffer and each member's (job, row, first)."""

    event: torch.cuda.Event | None
    host: torch.Tensor
    members: list[tuple[object, int, int]]


class SlabStream:
    """One stream's chunks as its slab row's pushes come back: audio and codes gathered into chunks of the request's
    schedule (the first once it holds what plays until the next push, then ``first_chunk_frames`` doubling up to
    ``chunk_frames``, or sooner where a player would run out of audio: :meth:`add`)."""

    def __init__(self, first_chunk_frames: int, chunk_frames: int, sample_rate: int = 44_100):
        self.size = first_chunk_frames
        self.chunk_frames = chunk_frames
        self.sample_rate = sample_rate
        self.audio: list[torch.Tensor] = []
        self.codes: list[torch.Tensor] = []
        self.frames = self.samples = 0  # handed out
        self.held_frames = self.held_samples = 0
        self.audible = False  # a chunk with audio has been handed out
        self.started: float | None = None  # when it was (the clock of ``add``'s ``now``)

    def add(
        self,
        audio: torch.Tensor,
        codes: torch.Tensor,
        final: bool,
        first_samples: int = 1,
        now: float | None = None,
        reserve: float = 0.0,
    ) -> AudioChunk | None:
        """Take a push's ``audio`` (samples) and ``codes`` (9, frames) of the stream; the chunk due now, if any. The
        first chunk with audio waits until it holds ``first_samples``: what plays until the next push arrives. With
        a clock (``now``, seconds), a chunk is also due before its size once the audio handed out, played from the
        first audible chunk on, lasts less than ``reserve`` seconds past ``now``."""
        if audio.numel():
            self.audio.append(audio)
        if codes.shape[-1]:
            self.codes.append(codes)
        self.held_frames += codes.shape[-1]
        self.held_samples += audio.numel()
        if not self.audible and not final and self.held_samples < max(first_samples, 1):
            return None
        due = final or not self.audible or self.held_frames >= self.size
        if not due and now is not None and self.started is not None:
            due = self.started + self.samples / self.sample_rate - now < reserve
        if not due or not (final or self.held_samples):
            return None
        audio = torch.cat(self.audio) if self.audio else torch.zeros(0)
        codes = torch.cat(self.codes, -1) if self.codes else torch.zeros(N_CODEBOOKS, 0, dtype=torch.long)
        chunk = AudioChunk(
            audio.view(1, 1, -1),
            codes.view(1, N_CODEBOOKS, -1),
            (self.frames, self.frames + self.held_frames),
            (self.samples, self.samples + self.held_samples),
            final,
        )
        self.frames += self.held_frames
        self.samples += self.held_samples
        self.audio, self.codes, self.held_frames, self.held_samples = [], [], 0, 0
        if not self.audible and chunk.audio.shape[-1]:
            self.audible, self.started = True, now
        if self.audible:
            self.size = min(2 * self.size, self.chunk_frames)
        return chunk


class SlabVocoding:
    """The slab of one engine's :class:`~zonos.engine.slots.Slots` (row ``r`` is slot ``r``'s stream), its ticks and
    the copies on their way back (see the module docstring). ``stream``: the CUDA stream its work runs on (None on
    the CPU). ``codec`` returns the model's codec; it is asked for at the first stream (a model that only
    generates codes never loads one)."""

    def __init__(self, codec, slots, frames: int, cuda_graphs: bool, casts: WeightCasts, eos_token_id: int, stream):
        self._codec = codec
        self.slots = slots
        self.frames = frames
        self.cuda_graphs = cuda_graphs
        self.casts = casts
        self.eos_token_id = eos_token_id
        self.stream = stream
        self.slab: VocoderSlab | None = None  # made for the first stream: rows x one stream's steady state
        self.members: dict[int, object] = {}  # row -> its job (running, or ended and draining)
        self.phase = 0  # ticks follow engine steps s with (s - phase) % frames == 0
        device = slots.offset.device
        self._skip = torch.zeros(slots.count, dtype=torch.int64, device=device)  # audio prefix frames not emitted
        # Column of codebook k of frame first + j in the delayed codes: first + skip + j + k + 1.
        self._columns = (
            torch.arange(frames, device=device)[None, :] + torch.arange(N_CODEBOOKS, device=device)[:, None] + 1
        )[None]
        self._positions = torch.arange(frames, device=device)[None, :]
        self._ring: list[torch.Tensor] = []
        self._ticks: deque[_Tick] = deque()
        self.spacing = 0.0  # seconds between recent ticks (a moving average)
        self._last_tick: float | None = None
        self.pushes = 0  # ticks pushed
        self.rows_pushed = 0  # streams' pushes they held
        self.most_rows = 0  # streams in one push

    @functools.cached_property
    def codec(self):
        return self._codec()

    @functools.cached_property
    def field(self):
        return receptive_field(self.codec.dac.config)

    @property
    def lookahead(self) -> int:
        """Frames before a stream's first audio."""
        return self.field.lookahead_frames

    def first_samples(self) -> int:
        """Samples a stream's first chunk waits for: what plays for ``FIRST_AUDIO_TICKS`` recent tick spacings. On
        the CPU no player keeps pace with the pushes anyway: there the first audio leaves at once."""
        if self.stream is None:
            return 1
        return max(int(FIRST_AUDIO_TICKS * self.spacing * self.codec.sampling_rate), 1)

    @staticmethod
    def eligible(request) -> bool:
        return request.stream and request.decoder is None and request.batch_size == 1 and request.flush

    @property
    def busy(self) -> bool:
        """Whether streams hold rows (running or draining) or copies are on their way."""
        return bool(self.members or self._ticks)

    def _on(self) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def admit(self, job, steps: int, skip: int, first_chunk_frames: int, chunk_frames: int) -> bool:
        """Give ``job`` (one slot, just prefilled, before engine step ``steps + 1``) its slot's row; False (no row)
        when frames of it are complete already (an audio prefix it emits): a push holds ``frames`` frames, so the
        row could not catch up."""
        t = self.frames
        row = job.slots[0]
        complete = job.offset - N_CODEBOOKS + 1 - skip  # the stream's complete frames now (negative: steps away)
        if complete > 0:
            return False
        if not self.members:
            # No tick is due for anyone else: place them so that the push holding this stream's first
            # first_samples() comes as soon as it can (one decode step past its first audio at 8.8 ms between ticks,
            # against a tick later if ticks stayed at its first audio).
            ready = math.ceil((self.first_samples() + self.field.lookahead_samples) / self.field.hop_length)
            self.phase = (steps + max(self.lookahead, ready) - complete) % t
        to_tick = 1 + (self.phase - steps - 1) % t  # steps to the next tick
        first = complete + to_tick - t
        end = job.limit - N_CODEBOOKS + 1 - skip  # frames at its length
        with self._on():
            if self.slab is None:
                self.slab = VocoderSlab(self.codec, self.slots.count, t, cuda_graphs=self.cuda_graphs, casts=self.casts)
            self.slab.decoder.cuda_graphs = self.cuda_graphs
            self.slab.admit(row, first, end)
            self._skip[row : row + 1].fill_(skip)
        job.row, job.slab_first, job.skip = row, first, skip
        job.slab = SlabStream(first_chunk_frames, chunk_frames, self.codec.sampling_rate)
        self.members[row] = job
        return True

    def end(self, job, offset: int) -> None:
        """``job``'s stream ends where column ``offset`` was written last (if not earlier, at an EOS)."""
        with self._on():
            self.slab.set_end(job.row, offset - N_CODEBOOKS + 1 - job.skip)

    def drop(self, job) -> None:
        """Forget ``job``'s row (cancelled or drained): its pushes on their way are not handed out."""
        if self.members.get(job.row) is job:
            del self.members[job.row]
        job.row = None

    @property
    def full(self) -> bool:
        """Whether every buffer of the ring holds a copy not collected yet (collect before the next tick)."""
        return len(self._ticks) >= RING

    def due(self, steps: int) -> bool:
        return bool(self.members) and (steps - self.phase) % self.frames == 0

    def tick(self) -> None:
        """Push every row up to the last member's and start the copy of its results to the host."""
        slab, t = self.slab, self.frames
        n = max(self.members) + 1
        if self.full:
            raise RuntimeError("every host buffer of the slab holds a copy not collected yet")
        if self.stream is not None:
            # The step's codes: the engine's stream is current here (inside _on() it would be the slab's own).
            self.stream.wait_stream(torch.cuda.current_stream(self.slots.offset.device))
        with self._on():
            first = slab.first[:n]
            delayed = self.slots.delayed[:n]
            columns = (first + self._skip[:n])[:, None, None] + self._columns
            raw = delayed.gather(2, columns.clamp(0, delayed.shape[-1] - 1))
            positions = first[:, None] + self._positions
            eos = torch.where((raw[:, 0] == self.eos_token_id) & (positions >= 0), positions, OPEN_END).amin(1)
            torch.minimum(slab.end[:n], eos, out=slab.end[:n])
            codes = playable(raw)
            audio = slab.push(codes)
            packed = torch.cat([audio.reshape(n, -1), codes.reshape(n, -1).float(), slab.end[:n, None].float()], 1)
            host = self._buffer(packed.shape[1])[:n]
            host.copy_(packed, non_blocking=True)
            event = None
            if self.stream is not None:
                event = torch.cuda.Event()
                event.record(self.stream)
        now = time.perf_counter()
        if self._last_tick is not None and now - self._last_tick < 1.0:  # not after an idle gap
            gap = now - self._last_tick
            self.spacing = gap if not self.spacing else 0.8 * self.spacing + 0.2 * gap
        self._last_tick = now
        members = [(job, row, job.slab_first) for row, job in self.members.items()]
        for job, _, _ in members:
            job.slab_first += t
        self._ticks.append(_Tick(event, host, members))
        self.pushes += 1
        self.rows_pushed += len(members)
        self.most_rows = max(self.most_rows, len(members))

    def _buffer(self, width: int) -> torch.Tensor:
        """The next pinned host buffer of the ring (rows x width)."""
        i = self.pushes % RING
        if i >= len(self._ring) or self._ring[i].shape[1] != width:
            buffer = torch.empty(self.slots.count, width, pin_memory=self.stream is not None)
            if i < len(self._ring):
                self._ring[i] = buffer
            else:
                self._ring.append(buffer)
        return self._ring[i]

    def collect_one(self, wait: bool) -> list[tuple[object, AudioChunk | None, bool]] | None:
        """The oldest tick's results once its copy has arrived (``wait``: waiting for it): per member still in its
        row, ``(job, chunk due or None, drained)``; None when no copy has arrived."""
        if not self._ticks:
            return None
        tick = self._ticks[0]
        if tick.event is not None and not tick.event.query():
            if not wait:
                return None
            tick.event.synchronize()
        self._ticks.popleft()
        slab, t = self.slab, self.frames
        audio_width = t * slab.hop
        first_samples = self.first_samples()
        # On the CPU no player keeps pace with the pushes: chunks follow their frame schedule alone there.
        now = time.perf_counter() if self.stream is not None else None
        reserve = RESERVE_TICKS * self.spacing
        # Read through numpy views of the host buffer: torch ops on its rows cost ~6 us each on the host, and a
        # member took six (150 members on a 2-core CPU: 4.9 ms a tick that way, 0.9 ms this way).
        host = tick.host.numpy()
        ends = host[:, -1].astype(np.int64).tolist()
        codes_of = torch.from_numpy(host[:, audio_width : audio_width + N_CODEBOOKS * t].astype(np.int64))
        out = []
        for job, row, first in tick.members:
            if self.members.get(row) is not job:
                continue  # cancelled since
            end = ends[row]
            start, stop, position = slab.samples(first, end)
            audio = torch.from_numpy(host[row, start - position : stop - position].copy())
            lo = max(first, 0)
            hi = max(min(first + t, end), lo)
            codes = codes_of[row].view(N_CODEBOOKS, t)[:, lo - first : hi - first]
            drained = slab.drained(first + t, end)
            out.append((job, job.slab.add(audio, codes, drained, first_samples, now, reserve), drained))
            if drained:
                self.drop(job)
        return out

    def expects_first_audio(self) -> bool:
        """Whether the oldest tick on its way holds a stream's first audio (a stream alone waits for it)."""
        if not self._ticks:
            return False
        return any(
            not job.slab.audible and first + self.frames >= self.lookahead for job, _, first in self._ticks[0].members
        )
