"""Streaming: turn the decode loop's delayed codes into audio chunks as frames complete.

A frame t is final once column t + 9 of the delayed codes is written (its 9th, most delayed codebook).
Final frames go to a stateful DAC decoder (:class:`zonos.codec.streaming.StreamingDACDecoder`) that keeps
each layer's context, so concatenated chunks equal the one-shot decode of the same codes. The decoder's
convolutions look ahead ``lookahead_frames`` frames, so the first push waits for that many frames plus
the first chunk. Later chunks double from the first chunk's size until they reach ``chunk_frames``: each chunk
then arrives well before the audio already handed out has played (a 2-frame first chunk is 31 ms of audio, and a
16-frame chunk takes ~34 ms of decode steps on an H200), and the steady chunks stay large for throughput.

On CUDA the vocoder runs on a side stream and each chunk after the first audio is handed out one decode step
later, so the vocoder overlaps the next step instead of stalling it; the first audio goes out as soon as it is
decoded, which keeps the time to first audio one step shorter. Chunk audio arrives on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from zonos.codebook_pattern import revert_delay_pattern

N_CODEBOOKS = 9
CODEBOOK_SIZE = 1024


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
            raise ValueError(f"{name} must be a positive int (frames of ~11.6 ms), got {value!r}")


def _final_frames(delayed: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Frames [start, end) of the delayed codes (all their columns must be written)."""
    return revert_delay_pattern(delayed[..., : end + N_CODEBOOKS])[..., start:end]


def stream_chunks(
    steps: Iterator[tuple[torch.Tensor, int]],
    decoder,
    eos_token_id: int,
    first_chunk_frames: int,
    chunk_frames: int,
) -> Iterator[AudioChunk]:
    """Consume the decode loop's ``(delayed_codes, offset)`` updates and yield audio chunks.

    Stops at the frame where every batch row has produced EOS (that frame is not emitted), or when the
    loop ends. Closing the returned iterator closes ``steps`` and resets the decoder.
    """
    decoder.reset()
    lookahead = decoder.receptive_field.lookahead_frames
    device = next(decoder.dac.parameters()).device
    side = torch.cuda.Stream(device) if device.type == "cuda" else None
    ready: list[torch.Tensor] = []  # final frames not yet pushed
    accepted = pushed = samples = 0
    size = first_chunk_frames  # frames in the chunk being assembled
    next_push = lookahead + size
    ended: torch.Tensor | None = None
    held: tuple[AudioChunk, torch.cuda.Event] | None = None  # CUDA: the chunk handed out after the next step

    def vocode(final: bool) -> AudioChunk:
        nonlocal pushed, samples
        codes = torch.cat(ready, dim=-1) if ready else None
        ready.clear()

        def run() -> torch.Tensor:
            parts = [decoder.push(codes)] if codes is not None else []
            if final:
                parts.append(decoder.flush())
            return torch.cat(parts, dim=-1) if parts else torch.zeros(1, 1, 0, device=device)

        if side is None:
            audio = run()
        else:
            # Vocoder, concatenation and the copy to pinned host memory all stay on the side stream, so each
            # waits for the one before it; the main stream only hands over the codes.
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                audio = run()
                host = torch.empty(audio.shape, dtype=audio.dtype, pin_memory=True)
                host.copy_(audio, non_blocking=True)
            audio = host
        if codes is None:
            codes = torch.zeros(audio.shape[0], N_CODEBOOKS, 0, dtype=torch.long, device=device)
        n_frames = codes.shape[-1]
        chunk = AudioChunk(audio, codes, (pushed, pushed + n_frames), (samples, samples + audio.shape[-1]), final)
        pushed += n_frames
        samples += audio.shape[-1]
        return chunk

    def take_final_frames(delayed: torch.Tensor, complete: int) -> bool:
        """Move frames [accepted, complete) to ``ready``; True once every row has reached EOS (that frame and
        everything after it are dropped). Reads the codes on the host: called once per chunk, not per step."""
        nonlocal accepted, ended
        if complete <= accepted:
            return False
        new = _final_frames(delayed, accepted, complete)
        eos = new[:, 0] == eos_token_id  # (b, n)
        prior = torch.zeros_like(eos[:, 0]) if ended is None else ended
        done = (prior[:, None] | eos.cummax(dim=1).values).all(dim=0)  # every row has ended by frame j
        finished = bool(done.any())
        if finished:
            new = new[..., : int(done.int().argmax())]
        ended = prior | eos.any(dim=1)
        ready.append(new.masked_fill(new >= CODEBOOK_SIZE, 0))
        accepted += new.shape[-1]
        return finished

    try:
        finished, last = False, None
        for last in steps:
            if held is not None:
                held[1].synchronize()
                yield held[0]
                held = None
            delayed, offset = last
            complete = max(offset - N_CODEBOOKS + 1, 0)
            if complete < next_push:
                continue
            if take_final_frames(delayed, complete):
                finished = True
                break
            chunk = vocode(final=False)
            size = min(2 * size, chunk_frames)
            next_push = accepted + size
            if side is None:
                yield chunk
            else:
                event = torch.cuda.Event()
                event.record(side)
                if chunk.samples[0] == 0:  # no audio handed out yet: time to first audio beats the overlap
                    event.synchronize()
                    yield chunk
                else:
                    held = (chunk, event)
        if not finished and last is not None:
            take_final_frames(last[0], max(last[1] - N_CODEBOOKS + 1, 0))
        if held is not None:
            held[1].synchronize()
            yield held[0]
            held = None
        final = vocode(final=True)
        if side is not None:
            side.synchronize()
        yield final
    finally:
        close = getattr(steps, "close", None)
        if close is not None:
            close()
        decoder.reset()
