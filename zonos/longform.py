"""Speech longer than one generation: text split into segments, spoken as one continuous utterance.

Each segment is one request on the model's engine. It is conditioned on the previous segment's text followed by
its own (the way Zonos continues audio: the prefix audio's transcript, then the new words) and continues the
previous segment's generated codes as its audio prefix, so voice and prosody carry over. Streamed, every segment
decodes with one streaming vocoder whose state carries across the boundary, so the audio has no seam: it equals
the one-shot decode of all segments' codes concatenated. Split the text with
:func:`zonos.conditioning.segments.split_text`.

A segment's request holds both texts' prefix, the previous segment's frames and its own in one slot, so each
segment's frames are capped (:func:`segment_budget`) to leave the next segment at least half of what its prefix
leaves: a segment that took most of the sequence would otherwise leave the next one no room at all.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

from zonos.codebook_pattern import N_CODEBOOKS
from zonos.conditioning import make_cond_dict, normalize_language, phonemize_text
from zonos.errors import ZonosInputError
from zonos.streaming import AudioChunk
from zonos.validation import check_int, describe

# What a user can do about a text that does not fit (front ends with their own settings pass theirs).
_FIX = (
    "Split the text into shorter segments (split_text's max_chars, --max-segment-chars), or load the model with a "
    "larger max_seqlen"
)


def _texts(segments: Sequence[str]) -> list[str]:
    """Each segment's conditioning text: the previous segment's text (the transcript of its audio prefix), then
    its own."""
    return [text if i == 0 else f"{segments[i - 1]} {text}" for i, text in enumerate(segments)]


def prefix_lengths(model, segments: Sequence[str], language: str = "en-us") -> list[int]:
    """The prefix tokens of each segment's request in :func:`speak_segments` (the previous segment's text and its
    own, phonemized, plus one token per other conditioner), found from the phonemes alone: no model work."""
    language = normalize_language(language)
    texts = _texts(segments)
    ids = phonemize_text(texts, [language] * len(texts))
    return [model.prefix_conditioner.prefix_length(len(t)) for t in ids]


def segment_budget(
    max_seqlen: int,
    prefix_length: int,
    previous_frames: int = 0,
    next_prefix_length: int | None = None,
    max_new_tokens: int = 86 * 30,
    segment: str = "a segment",
) -> int:
    """Most new frames for one segment's request: what the ``max_seqlen`` positions leave after its prefix, the
    previous segment's frames (its audio prefix) and the 9 delay steps, and with a next segment (its prefix
    length given) no more than half of what that segment's prefix leaves, so it has room for as many frames;
    at most ``max_new_tokens``. A segment's budget is then never below
    ``(max_seqlen - 9 - prefix length) // 2``. Raises :class:`~zonos.errors.ZonosInputError` when no frame fits;
    ``segment`` names it in the message."""
    room = max_seqlen - N_CODEBOOKS - prefix_length - previous_frames
    if next_prefix_length is not None:
        room = min(room, (max_seqlen - N_CODEBOOKS - next_prefix_length) // 2)
    if room < 1:
        taken = f"its prefix takes {prefix_length} positions"
        if previous_frames:
            taken += f", the previous segment's audio {previous_frames}"
        taken += f" and the delay pattern {N_CODEBOOKS}"
        if next_prefix_length is not None:
            taken += f", and the next segment's prefix ({next_prefix_length}) needs room for its own audio"
        raise ZonosInputError(f"{segment} does not fit in the model's {max_seqlen} positions: {taken}. {_FIX}")
    return min(max_new_tokens, room)


def longform_budget(
    model,
    segments: Sequence[str],
    language: str = "en-us",
    max_new_tokens: int = 86 * 30,
    max_seqlen: int | None = None,
    *,
    fix: str = _FIX,
) -> int:
    """The frames every segment of :func:`speak_segments` is sure to get (each gets at least this, up to
    ``max_new_tokens``), from the phonemes alone, so it runs before any model work. Raises
    :class:`~zonos.errors.ZonosInputError` when a segment's texts leave no room for audio; ``fix`` ends its
    message with what the caller's user can do (a front end names its own settings). ``max_seqlen``: the slots'
    positions (default: those of the model's engine)."""
    if max_seqlen is None:
        max_seqlen = model.engine.max_seqlen
    lengths = prefix_lengths(model, segments, language)
    longest = max(lengths)
    room = max_seqlen - N_CODEBOOKS - longest
    if len(lengths) > 1:
        room //= 2  # the previous segment's audio and this one's share what the prefix leaves
    if room < 1:
        k = lengths.index(longest)
        texts = "its text" if k == 0 else "its text and the previous segment's"
        raise ZonosInputError(
            f"segment {k + 1} of {len(segments)}: {texts} take {longest} of the model's {max_seqlen} positions "
            f"and the delay pattern {N_CODEBOOKS}, leaving no room for audio. {fix}"
        )
    return min(max_new_tokens, room)


def speak_segments(
    model,
    segments: list[str],
    cond: dict | None = None,
    stream: bool = False,
    on_segment: Callable[[int, int, int], None] | None = None,
    **generate_kwargs,
) -> torch.Tensor | Iterator[AudioChunk]:
    """Speak ``segments`` as one utterance: codes (1, 9, frames) of every segment in order, or with ``stream``
    :class:`~zonos.streaming.AudioChunk` s whose frame and sample ranges run over the whole utterance.

    ``cond`` holds :func:`zonos.conditioning.make_cond_dict`'s arguments except ``text`` (language, speaker,
    emotion, ...); ``generate_kwargs`` go to every segment's :meth:`Zonos.generate` (``max_new_tokens`` is per
    segment, and each segment gets at most what :func:`segment_budget` leaves it in the engine's slots; a
    ``generator`` is drawn from segment after segment, so a seeded one makes the whole utterance reproducible).
    ``on_segment(index, frames, budget)`` is called after each segment (index from 0) with the frames it took and
    the most it could take: ``frames == budget`` means the cap stopped it before the model ended it, so its audio
    may stop early. A text that leaves some segment no room for audio is refused before any model work."""
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
    if on_segment is not None and not callable(on_segment):
        raise ZonosInputError(f"on_segment must be a function (or None), got {type(on_segment).__name__}")
    kwargs = dict(generate_kwargs)
    max_new_tokens = check_int(
        "max_new_tokens", kwargs.pop("max_new_tokens", 86 * 30), 1, hint="frames per segment; 86 are about a second"
    )
    cond = dict(cond or {})
    cond.setdefault("language", "en-us")
    for text in segments:  # each alone, before any work: a later segment's text reaches the model only after the
        make_cond_dict(text=text, **cond)  # previous one's, which would hide one that has nothing to say
    plan = _Plan(model, list(segments), cond, max_new_tokens, on_segment)
    if stream:
        return _stream(plan, kwargs)
    parts, previous = [], None
    for k, prefix, budget in plan.segments():
        codes = model.generate(prefix, audio_prefix_codes=previous, max_new_tokens=budget, **kwargs)
        new = codes[..., 0 if previous is None else previous.shape[-1] :]
        parts.append(new)
        plan.done(k, new.shape[-1], budget)
        previous = new
    return torch.cat(parts, dim=-1)


class _Plan:
    """One utterance's segments: each one's conditioning and frame budget in turn, and the report on its end."""

    def __init__(self, model, segments: list[str], cond: dict, max_new_tokens: int, on_segment):
        self.model, self.segments_text, self.cond = model, segments, cond
        self.max_new_tokens, self.on_segment = max_new_tokens, on_segment
        self.previous_frames = 0
        self.max_seqlen = model.engine.max_seqlen
        self.lengths = prefix_lengths(model, segments, cond["language"])
        longform_budget(model, segments, cond["language"], max_new_tokens, self.max_seqlen)  # refuse before work

    def segments(self) -> Iterator[tuple[int, torch.Tensor, int]]:
        """(index, prefix, budget) of each segment in turn, the budget counting the frames the previous one took
        (reported with :meth:`done` before the next is drawn)."""
        n = len(self.segments_text)
        for k, text in enumerate(_texts(self.segments_text)):
            with torch.inference_mode():  # no autograd graph for a prefix that only feeds generation
                prefix = self.model.prepare_conditioning(make_cond_dict(text=text, **self.cond))
            budget = segment_budget(
                self.max_seqlen,
                prefix.shape[1],
                self.previous_frames,
                self.lengths[k + 1] if k + 1 < n else None,
                self.max_new_tokens,
                f"segment {k + 1} of {n}",
            )
            yield k, prefix, budget

    def done(self, index: int, frames: int, budget: int) -> None:
        """Segment ``index`` took ``frames`` of its ``budget``."""
        self.previous_frames = frames
        if self.on_segment is not None:
            self.on_segment(index, frames, budget)


def _stream(plan: _Plan, kwargs: dict) -> Iterator[AudioChunk]:
    from zonos.codec.streaming import StreamingDACDecoder

    model = plan.model
    kwargs = dict(kwargs)
    progress_bar = kwargs.pop("progress_bar", False)
    decoder = StreamingDACDecoder(model.autoencoder, cuda_graphs=model.engine.vocoder_graphs)
    previous, frames, samples = None, 0, 0
    last = len(plan.segments_text) - 1
    for k, prefix, budget in plan.segments():
        handle = model.submit(
            prefix,
            audio_prefix_codes=previous,
            max_new_tokens=budget,
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
        taken = 0 if previous is None else previous.shape[-1]
        plan.done(k, taken, budget)
        if taken == 0:
            previous = None
