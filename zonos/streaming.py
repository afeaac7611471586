"""Streaming: turn a request's delayed codes into audio chunks as frames complete.

A frame t is final once column t + 9 of the delayed codes is written (its 9th, most delayed codebook).
Final frames go to a stateful DAC decoder (:class:`zonos.codec.streaming.StreamingDACDecoder`) that keeps
each layer's context, so concatenated chunks equal the one-shot decode of the same codes. The decoder's
convolutions look ahead ``lookahead_frames`` frames, so the first push waits for that many frames plus
the first chunk. Later chunks double from the first chunk's size until they reach ``chunk_frames``: each chunk
then arrives well before the audio already handed out has played (a 2-frame first chunk is 31 ms of audio, and a
16-frame chunk takes ~34 ms of decode steps on an H200), and the steady chunks stay large for throughput.

On CUDA the vocoder runs on a side stream, so it overlaps the next decode step instead of stalling it; the
engine hands a chunk out once its event has completed, except the first audio, which it waits for (time to
first audio). Chunk audio arrives on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zonos.codebook_pattern import CODEBOOK_SIZE, N_CODEBOOKS, revert_delay_pattern
from zonos.errors import ZonosInputError

# Streaming schedule (H200, benchmarks/streaming.py; docs/BENCHMARKS.md, decisions: DEFAULT_FIRST_CHUNK_FRAMES): a
# 1-frame first chunk hands out audio ~3 ms sooner than a 2-frame one (48.0 vs 51.0 ms p50, where the decode steps
# dominate) at the same real-time factor (5.32 vs 5.27); chunks then double up to 16 frames, where a streamed
# frame's vocoder cost is 0.027 ms, 1.24-1.31x the one-shot decode's 0.021 (8 frames: 0.045, 2x). Steady chunks
# arrive ~35 ms apart and play for 186 ms each.
DEFAULT_FIRST_CHUNK_FRAMES = 1
DEFAULT_CHUNK_FRAMES = 16


@dataclass
class AudioChunk:
    """One piece of a streamed utterance.

    Attributes:
        audio: (batch, 1, samples) float32 waveform at 44.1 kHz; CPU when the model runs on CUDA.
        codes: (batch, 9, frames) the code frames pushed to the vocoder for this chunk (EOS/MASK as 0);
            concatenated over chunks they equal ``generate``'s one-shot codes.
        frames: [start, end) indices of those code frames in the utterance.
        samples: [start, end) indices of ``audio`` in the utterance's waveform.
        final: True for the last chunk (the vocoder's tail is flushed into it).
    """

    audio: torch.Tensor
    codes: torch.Tensor
    frames: tuple[int, int]
    samples: tuple[int, int]
    final: bool


def check_chunk_sizes(first_chunk_frames: int, chunk_frames: int) -> None:
    """Chunk sizes are positive integer frame counts."""
    for name, value in (("first_chunk_frames", first_chunk_frames), ("chunk_frames", chunk_frames)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ZonosInputError(f"{name} must be a positive int (frames of ~11.6 ms), got {value!r}")


def final_frames(delayed: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Frames [start, end) of the delayed codes (b, 9, columns) (all their columns must be written)."""
    return revert_delay_pattern(delayed[..., : end + N_CODEBOOKS])[..., start:end]


def playable(codes: torch.Tensor) -> torch.Tensor:
    """Codes with EOS, MASK and never-written slots (a row that ended before the others) replaced by 0, as
    upstream returns them, so they decode directly."""
    return codes.masked_fill((codes >= CODEBOOK_SIZE) | (codes < 0), 0)


class ChunkAssembler:
    """One stream's schedule and vocoder: fed the request's delayed codes as columns are written, it decides when
    a chunk is due, pushes its frames to the decoder and builds the :class:`AudioChunk`.

    Stops at the frame where every batch row has produced EOS (that frame is not emitted). ``side`` is the CUDA
    stream the vocoder runs on (None: the current one, e.g. on the CPU); chunks come with an event the caller
    waits on before handing the chunk out.
    """

    def __init__(
        self,
        decoder,
        eos_token_id: int,
        first_chunk_frames: int,
        chunk_frames: int,
        side=None,
        skip_frames: int = 0,
        flush: bool = True,
    ):
        """``skip_frames``: leading frames not to vocode (an audio prefix whose audio the caller has); with a
        decoder that has already decoded frames (a stream continued, see :mod:`zonos.longform`) its state goes on,
        else it is reset. ``flush``: whether the last chunk flushes the decoder's tail (False: a later request
        continues it)."""
        self.decoder = decoder
        self.eos_token_id = eos_token_id
        self.chunk_frames = chunk_frames
        self.side = side
        self.flush = flush
        continuing = decoder.frames_pushed > 0
        if not continuing:
            decoder.reset()
        self.lookahead = 0 if continuing else decoder.receptive_field.lookahead_frames
        self.size = first_chunk_frames  # frames in the chunk being assembled
        self.skip_frames = skip_frames
        self.accepted = skip_frames
        self.next_push = skip_frames + self.lookahead + self.size
        self.pushed = self.samples = 0
        self.ended: torch.Tensor | None = None  # (b,) rows that have produced EOS
        self.finished = False  # every row has ended: no frame after this one
        self.ready: list[torch.Tensor] = []  # final frames not yet pushed

    def due(self, offset: int) -> bool:
        """Whether the frames complete once column ``offset`` is written fill the next chunk."""
        return not self.finished and offset - N_CODEBOOKS + 1 >= self.next_push

    def take(self, delayed: torch.Tensor, offset: int, eos_free: int = 0) -> None:
        """Move the frames complete at column ``offset`` to the next chunk. Finding the end reads the codes on the
        host (once per chunk, not per step), which waits for the GPU; frames before ``eos_free`` are known to hold
        no EOS (the engine read its slots' flags, which cover the prefill's token too), so they need no read."""
        complete = max(offset - N_CODEBOOKS + 1, 0)
        if self.finished or complete <= self.accepted:
            return
        new = final_frames(delayed, self.accepted, complete)
        if complete <= eos_free:
            self.ready.append(playable(new))
            self.accepted = complete
            return
        eos = new[:, 0] == self.eos_token_id  # (b, n)
        prior = torch.zeros_like(eos[:, 0]) if self.ended is None else self.ended
        done = (prior[:, None] | eos.cummax(dim=1).values).all(dim=0)  # every row has ended by frame j
        if bool(done.any()):
            self.finished = True
            new = new[..., : int(done.int().argmax())]
        self.ended = prior | eos.any(dim=1)
        self.ready.append(playable(new))
        self.accepted += new.shape[-1]

    def take_ready(self) -> torch.Tensor | None:
        """The taken frames not yet pushed (b, 9, n), handed over for a push (None: none)."""
        codes = torch.cat(self.ready, dim=-1) if self.ready else None
        self.ready.clear()
        return codes

    def vocode(self, final: bool) -> tuple[AudioChunk, torch.cuda.Event | None]:
        """Push the taken frames (and with ``final`` flush the decoder's tail) into the next chunk."""
        codes = self.take_ready()
        device = next(self.decoder.dac.parameters()).device

        def run() -> torch.Tensor:
            parts = [self.decoder.push(codes)] if codes is not None else []
            if final and self.flush:
                parts.append(self.decoder.flush())
            return torch.cat(parts, dim=-1) if parts else torch.zeros(1, 1, 0, device=device)

        event = None
        if self.side is None:
            audio = run()
        else:
            # Vocoder, concatenation and the copy to pinned host memory stay on the side stream, each after the
            # one before; the engine's stream only hands over the codes.
            self.side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(self.side):
                audio = run()
                host = torch.empty(audio.shape, dtype=audio.dtype, pin_memory=True)
                host.copy_(audio, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.side)
            audio = host
        if codes is None:
            codes = torch.zeros(audio.shape[0], N_CODEBOOKS, 0, dtype=torch.long, device=device)
        return self.pushed_chunk(codes, audio, final), event

    def pushed_chunk(self, codes: torch.Tensor, audio: torch.Tensor, final: bool = False) -> AudioChunk:
        """The chunk of ``codes`` (pushed here or by a bank) and their ``audio``; the schedule moves on."""
        n = codes.shape[-1]
        chunk = AudioChunk(
            audio, codes, (self.pushed, self.pushed + n), (self.samples, self.samples + audio.shape[-1]), final
        )
        self.pushed += n
        self.samples += audio.shape[-1]
        if not final:
            self.size = min(2 * self.size, self.chunk_frames)
            self.next_push = self.accepted + self.size
        return chunk
