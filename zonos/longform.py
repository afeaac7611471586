"""Speech longer than one generation: text split into segments, spoken as one continuous utterance.

Each segment is one request on the model's engine. It is conditioned on the previous segment's text followed by
its own (the way Zonos continues audio: the prefix audio's transcript, then the new words) and continues the
previous segment's generated codes as its audio prefix, so voice and prosody carry over. Streamed, every segment
decodes with one streaming vocoder whose state carries across the boundary, so the audio has no seam: it equals
the one-shot decode of all segments' codes concatenated. Split the text with
:func:`zonos.conditioning.segments.split_text`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping

import torch

from zonos.conditioning import make_cond_dict
from zonos.errors import ZonosInputError
from zonos.streaming import AudioChunk
from zonos.validation import describe


def _prefixes(model, segments: list[str], cond: dict) -> Iterator[torch.Tensor]:
    previous = None
    for text in segments:
        full = text if previous is None else f"{previous} {text}"
        yield model.prepare_conditioning(make_cond_dict(text=full, **cond))
        previous = text


def speak_segments(
    model,
    segments: list[str],
    cond: dict | None = None,
    stream: bool = False,
    **generate_kwargs,
) -> torch.Tensor | Iterator[AudioChunk]:
    """Speak ``segments`` as one utterance: codes (1, 9, frames) of every segment in order, or with ``stream``
    :class:`~zonos.streaming.AudioChunk` s whose frame and sample ranges run over the whole utterance.

    ``cond`` holds :func:`zonos.conditioning.make_cond_dict`'s arguments except ``text`` (language, speaker,
    emotion, ...); ``generate_kwargs`` go to every segment's :meth:`Zonos.generate` (``max_new_tokens`` is per
    segment; a ``generator`` is drawn from segment after segment, so a seeded one makes the whole utterance
    reproducible)."""
    if (
        not isinstance(segments, (list, tuple))
        or not segments
        or any(not isinstance(s, str) or not s.strip() for s in segments)
    ):
        raise ZonosInputError(
            f"segments must be a non-empty list of non-empty strings, got {describe(segments)}; "
            "split text with zonos.conditioning.segments.split_text"
        )
    if cond is not None and not isinstance(cond, Mapping):
        raise ZonosInputError(f"cond must be a dict of make_cond_dict's arguments, got {type(cond).__name__}")
    if cond is not None and "text" in cond:
        raise ZonosInputError("cond holds 'text': the segments are the text; pass the other make_cond_dict arguments")
    unknown = sorted(set(cond or {}) - set(inspect.signature(make_cond_dict).parameters))
    if unknown:
        raise ZonosInputError(f"cond holds {unknown}, which make_cond_dict does not take")
    for key in ("audio_prefix_codes", "batch_size", "callback"):
        if key in generate_kwargs:
            raise ZonosInputError(f"speak_segments sets {key} itself (one utterance, each segment continuing the last)")
    cond = dict(cond or {})
    cond.setdefault("language", "en-us")
    for text in segments:  # each alone, before any work: a later segment's text reaches the model only after the
        make_cond_dict(text=text, **cond)  # previous one's, which would hide one that has nothing to say
    if stream:
        return _stream(model, segments, cond, generate_kwargs)
    parts, previous = [], None
    for prefix in _prefixes(model, segments, cond):
        codes = model.generate(prefix, audio_prefix_codes=previous, **generate_kwargs)
        new = codes[..., 0 if previous is None else previous.shape[-1] :]
        parts.append(new)
        previous = new
    return torch.cat(parts, dim=-1)


def _stream(model, segments: list[str], cond: dict, kwargs: dict) -> Iterator[AudioChunk]:
    from zonos.codec.streaming import StreamingDACDecoder

    kwargs = dict(kwargs)
    progress_bar = kwargs.pop("progress_bar", False)
    decoder = StreamingDACDecoder(model.autoencoder, cuda_graphs=model.engine.vocoder_graphs)
    previous, frames, samples = None, 0, 0
    last = len(segments) - 1
    for k, prefix in enumerate(_prefixes(model, segments, cond)):
        handle = model.submit(
            prefix,
            audio_prefix_codes=previous,
            stream=True,
            decoder=decoder,
            emit_prefix=False,
            flush=k == last,
            progress_bar=progress_bar,
            **kwargs,
        )
        new = []
        try:
            for chunk in handle:
                new.append(chunk.codes)
                n, m = chunk.codes.shape[-1], chunk.audio.shape[-1]
                yield AudioChunk(
                    chunk.audio, chunk.codes, (frames, frames + n), (samples, samples + m), chunk.final and k == last
                )
                frames += n
                samples += m
        finally:
            handle.cancel()
        previous = torch.cat(new, dim=-1) if new else None
        if previous is None or previous.shape[-1] == 0:
            previous = None
