"""Streams' vocoder pushes batched across slots: the engine's :class:`~zonos.codec.streaming.DecoderBank` s.

A stream starts on a decoder of its own (its first chunks ramp up, 2, 4, 8, ... frames). Once its chunks reach
``chunk_frames`` C, one chunk is resized so that its pushes fall on the engine's ticks (steps that are a multiple of
C), one more steady push follows on its own decoder, and its state then moves into a row of the bank for C: at each
tick, one push decodes the next C frames of every stream in the bank. A stream leaves the bank at its end (for its
last, shorter push and the flush, on a decoder of its own again) or when cancelled. Only batch-1 streams on the
engine's own decoders take part. The audio is the same: rows decode what the streams decode alone (the one-shot
decode), whatever the chunk boundaries.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from zonos.codec.streaming import DecoderBank, StreamingDACDecoder, WeightCasts

RAMP, ALIGN, ENTER, BANKED = "ramp", "align", "enter", "banked"  # a stream's way into a bank


class BankedVocoding:
    """The banks of one engine (one per steady chunk size), their member jobs and the alignment of their pushes.

    ``decoder`` gives a free single-stream decoder and ``free`` takes one back (the engine's pool), ``side`` gives the
    CUDA stream a new bank runs on.
    """

    def __init__(
        self,
        codec,
        rows: int,
        cuda_graphs: bool,
        casts: WeightCasts,
        decoder: Callable[[], StreamingDACDecoder],
        free: Callable[[StreamingDACDecoder], None],
        side: Callable,
    ):
        self.codec = codec
        self.rows = rows
        self.cuda_graphs = cuda_graphs
        self.casts = casts
        self._decoder = decoder
        self._free = free
        self._side = side
        self.banks: dict[int, tuple[DecoderBank, torch.cuda.Stream | None]] = {}
        self.members: dict[int, list] = {}  # chunk size -> its bank's jobs, by row
        self.due: list = []  # banked jobs whose chunk is due at this step
        self.entering: list = []  # jobs whose steady push alone was at this step's tick: they join after it
        self.pushes = 0  # bank pushes made
        self.rows_pushed = 0  # streams' chunks they decoded
        self.most_rows = 0  # in one push

    @staticmethod
    def eligible(request) -> bool:
        return request.stream and request.decoder is None and request.batch_size == 1 and request.flush

    def after_solo_push(self, job, steps: int) -> None:
        """Steer a stream on its own decoder into a bank, after its push at engine step ``steps``: its next push is
        due ``assembler.size`` steps later."""
        a = job.assembler
        c = a.chunk_frames
        if job.bank_phase == RAMP and a.size == c:
            a.size = c - steps % c  # the push after this one is due at a tick
            a.next_push = a.accepted + a.size
            job.bank_phase = ALIGN
        elif job.bank_phase == ALIGN:
            a.size = c  # this push was at a tick; the next is too, and leaves a steady state
            a.next_push = a.accepted + c
            job.bank_phase = ENTER
        elif job.bank_phase == ENTER and steps % c == 0 and a.size == c:
            self.entering.append(job)  # after this tick's bank push, which does not hold its chunk
        elif job.bank_phase == ENTER:  # out of step (not expected): it stays on its own decoder
            job.bank_phase = None

    def _enter(self, job) -> None:
        c = job.assembler.chunk_frames
        if c in self.banks and not self.members[c] and self._stale(self.banks[c][0]):
            del self.banks[c], self.members[c]
        if c not in self.banks:
            bank = DecoderBank(self.codec, self.rows, c, cuda_graphs=self.cuda_graphs, casts=self.casts)
            self.banks[c] = (bank, self._side())
            self.members[c] = []
        bank, side = self.banks[c]
        with _on(side):
            job.row = bank.admit(job.decoder)
            self._free(job.decoder)  # its state is in the bank now
        job.decoder = job.assembler.decoder = None
        self.members[c].append(job)
        job.bank_phase = BANKED

    def _stale(self, bank: DecoderBank) -> bool:
        """Whether an idle bank's decoder replays other settings than new streams use (graphs off, another backend)."""
        return bank.decoder.cuda_graphs != self.cuda_graphs or bank.decoder._stages[0].ops is not self.codec.dac.ops

    def leave(self, job, keep: bool) -> None:
        """Take ``job`` out of its bank; with ``keep`` its state goes on in a decoder of its own (for its last push)."""
        c = job.assembler.chunk_frames
        bank, side = self.banks[c]
        members = self.members[c]
        solo: StreamingDACDecoder | None = self._decoder() if keep else None
        with _on(side):
            moved = bank.release(job.row, solo)
        if moved is not None:
            members[moved].row = job.row
            members[job.row] = members[moved]
        members.pop()
        job.row = None
        job.bank_phase = None
        if solo is not None:
            solo.frames_pushed = job.assembler.pushed
            job.decoder = job.assembler.decoder = solo

    @property
    def pending(self) -> bool:
        """Whether this step has bank pushes or joins to make (:meth:`push_due`)."""
        return bool(self.due or self.entering)

    def push_due(self, delayed: Callable, hand_out: Callable, finish: Callable, running: list) -> None:
        """One push per bank of the chunks due now, then the joins of the streams entering at this tick:
        ``delayed(job)`` gives a job's delayed codes, ``hand_out(job)`` hands its arrived chunks out, ``finish(job)``
        ends a job whose chunk ended its stream; ``running`` are the engine's running jobs."""
        due, self.due = self.due, []
        entering, self.entering = self.entering, []
        for c, (bank, side) in self.banks.items():
            jobs = [job for job in due if job.row is not None and job.assembler.chunk_frames == c]
            if not jobs:
                continue
            for job in jobs:
                job.assembler.take(delayed(job), job.offset, job.eos_free)
            due_now = {id(job) for job in jobs}  # (sets: a bank may hold hundreds of rows)
            for job in list(self.members[c]):
                ready = sum(f.shape[-1] for f in job.assembler.ready)
                if id(job) not in due_now or job.assembler.finished or ready != c:
                    self.leave(job, keep=True)  # its stream ends in this chunk (or is out of step): alone
                    if job.assembler.finished:
                        finish(job)
                    elif id(job) in due_now:
                        job.pending.append(job.assembler.vocode(final=False))
            pushing = list(self.members[c])
            if not pushing:
                continue
            codes = torch.cat([job.assembler.take_ready() for job in pushing])
            event = None
            if side is not None:  # the codes come from the engine's stream
                side.wait_stream(torch.cuda.current_stream(side.device))
            with _on(side):
                audio = bank.push(codes)
                if side is not None:
                    host = torch.empty(audio.shape, dtype=audio.dtype, pin_memory=True)
                    host.copy_(audio, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(side)
                    audio = host
            self.pushes += 1
            self.rows_pushed += len(pushing)
            self.most_rows = max(self.most_rows, len(pushing))
            for i, job in enumerate(pushing):
                job.pending.append((job.assembler.pushed_chunk(codes[i : i + 1], audio[i : i + 1]), event))
                hand_out(job)
        still_running = {id(job) for job in running} if entering else set()
        for job in entering:
            if id(job) in still_running and job.decoder is not None and job.bank_phase == ENTER:  # (not ended since)
                self._enter(job)

    def drop_idle(self) -> None:
        """Forget the banks no stream uses (e.g. their graphs replay another backend)."""
        for c in [c for c, jobs in self.members.items() if not jobs]:
            del self.banks[c], self.members[c]


def _on(side) -> contextlib.AbstractContextManager:
    return torch.cuda.stream(side) if side is not None else contextlib.nullcontext()
