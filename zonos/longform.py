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

An audio prefix (a clip's codes, its transcript leading the first segment's text) is continued by the first
segment as by :meth:`~zonos.model.Zonos.generate`; its frames count against that segment's positions. The first
segment's request is submitted when :func:`speak_segments` is called, so an engine that is full refuses the
utterance at once (:class:`~zonos.errors.EngineFullError`); a later segment whose submit finds the engine full
waits for room (up to ``full_wait`` seconds), since the utterance is already under way.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

from zonos.codebook_pattern import CODEBOOK_SIZE, N_CODEBOOKS
from zonos.conditioning import make_cond_dict, normalize_language, phonemize_text
from zonos.errors import EngineFullError, ZonosInputError
from zonos.streaming import AudioChunk
from zonos.validation import check_code_tensor, check_int, check_real, describe

FULL_WAIT_S = 60.0  # how long a later segment waits for room in a full engine before the utterance fails
_FULL_POLL_S = (0.005, 0.1)  # first and longest pause between its submits

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
    prefix_frames: int = 0,
    fix: str = _FIX,
) -> int:
    """The frames every segment of :func:`speak_segments` is sure to get (each gets at least this, up to
    ``max_new_tokens``), from the phonemes alone, so it runs before any model work. Raises
    :class:`~zonos.errors.ZonosInputError` when a segment's texts leave no room for audio; ``fix`` ends its
    message with what the caller's user can do (a front end names its own settings). ``max_seqlen``: the slots'
    positions (default: those of the model's engine); ``prefix_frames``: the audio prefix the first segment
    continues."""
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
    first = max_seqlen - N_CODEBOOKS - lengths[0] - prefix_frames
    if first < 1:
        raise ZonosInputError(
            f"segment 1 of {len(segments)}: its text takes {lengths[0]} and the audio prefix {prefix_frames} frames "
            f"of the model's {max_seqlen} positions (the delay pattern {N_CODEBOOKS}), leaving no room for new "
            f"audio. Shorten the prefix audio or the first segment's text. {fix}"
        )
    return min(max_new_tokens, room, first)


def speak_segments(
    model,
    segments: list[str],
    cond: dict | None = None,
    stream: bool = False,
    on_segment: Callable[[int, int, int], None] | None = None,
    audio_prefix_codes: torch.Tensor | None = None,
    full_wait: float = FULL_WAIT_S,
    **generate_kwargs,
) -> torch.Tensor | Iterator[AudioChunk]:
    """Speak ``segments`` as one utterance: codes (1, 9, frames) of every segment in order, or with ``stream``
    :class:`~zonos.streaming.AudioChunk` s whose frame and sample ranges run over the whole utterance.

    ``cond`` holds :func:`zonos.conditioning.make_cond_dict`'s arguments except ``text`` (language, speaker,
    emotion, ...); ``generate_kwargs`` go to every segment's :meth:`Zonos.generate` (``max_new_tokens`` is per
    segment, and each segment gets at most what :func:`segment_budget` leaves it in the engine's slots; a
    ``generator`` is drawn from segment after segment, so a seeded one makes the whole utterance reproducible).
    ``audio_prefix_codes`` (1, 9, frames), e.g. ``autoencoder.encode`` of a clip whose transcript begins the first
    segment, is continued by the first segment and is not part of the result. ``on_segment(index, frames,
    budget)`` is called after each segment (index from 0) with the frames it took and the most it could take:
    ``frames == budget`` means the cap stopped it before the model ended it, so its audio may stop early. A text
    that leaves some segment no room for audio is refused before any model work.

    The first segment is submitted before this returns (streamed too), so a full engine refuses the utterance
    here with :class:`~zonos.errors.EngineFullError`; a later segment that finds the engine full retries for up
    to ``full_wait`` seconds (its seed drawn again from the same generator state) before the utterance fails."""
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
    for key in ("batch_size", "callback"):
        if key in generate_kwargs:
            raise ZonosInputError(f"speak_segments sets {key} itself (one utterance, each segment continuing the last)")
    if audio_prefix_codes is not None:
        check_code_tensor("audio_prefix_codes", audio_prefix_codes, N_CODEBOOKS, CODEBOOK_SIZE, (1,))
    if on_segment is not None and not callable(on_segment):
        raise ZonosInputError(f"on_segment must be a function (or None), got {type(on_segment).__name__}")
    full_wait = check_real("full_wait", full_wait, 0, hint="seconds a later segment waits for room in the engine")
    kwargs = dict(generate_kwargs)
    max_new_tokens = check_int(
        "max_new_tokens", kwargs.pop("max_new_tokens", 86 * 30), 1, hint="frames per segment; 86 are about a second"
    )
    cond = dict(cond or {})
    cond.setdefault("language", "en-us")
    for text in segments:  # each alone, before any work: a later segment's text reaches the model only after the
        make_cond_dict(text=text, **cond)  # previous one's, which would hide one that has nothing to say
    plan = _Plan(model, list(segments), cond, max_new_tokens, on_segment, audio_prefix_codes, full_wait)
    if stream:
        return _Utterance(plan, kwargs)
    parts, previous = [], audio_prefix_codes
    for k, prefix, budget in plan.segments():
        handle = plan.submit(k, prefix, previous, budget, dict(kwargs, stream=False))
        try:
            codes = handle.result()
        finally:
            _close(handle)
        new = codes[..., 0 if previous is None else previous.shape[-1] :]
        parts.append(new)
        plan.done(k, new.shape[-1], budget)
        previous = new
    return torch.cat(parts, dim=-1)


class _Plan:
    """One utterance's segments: each one's conditioning, frame budget and request in turn, and the report on
    its end."""

    def __init__(self, model, segments: list[str], cond: dict, max_new_tokens: int, on_segment,
                 prefix_codes: torch.Tensor | None, full_wait: float):  # fmt: skip
        self.model, self.segments_text, self.cond = model, segments, cond
        self.max_new_tokens, self.on_segment, self.full_wait = max_new_tokens, on_segment, full_wait
        self.prefix_codes = prefix_codes
        self.previous_frames = 0 if prefix_codes is None else prefix_codes.shape[-1]
        self.max_seqlen = model.engine.max_seqlen
        self.lengths = prefix_lengths(model, segments, cond["language"])
        longform_budget(  # refuse before work
            model, segments, cond["language"], max_new_tokens, self.max_seqlen, prefix_frames=self.previous_frames
        )

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

    def submit(self, k: int, prefix: torch.Tensor, previous: torch.Tensor | None, budget: int, kwargs: dict):
        """Segment ``k``'s request on the model's engine. A full engine refuses the first at once; a later one
        retries for up to ``full_wait`` seconds, its seeds drawn again from the generator's state before the
        refused try, so that waiting changes no codes."""
        kwargs = dict(kwargs, audio_prefix_codes=previous, max_new_tokens=budget)
        rng = kwargs.get("generator")
        rng = torch.default_generator if rng is None else rng
        state = rng.get_state()
        pause, deadline = _FULL_POLL_S[0], time.monotonic() + self.full_wait
        while True:
            try:
                return self.model.submit(prefix, **kwargs)
            except EngineFullError as err:
                if k == 0:
                    raise
                if time.monotonic() >= deadline:
                    raise EngineFullError(
                        f"segment {k + 1} of {len(self.segments_text)}: the engine stayed full for "
                        f"{self.full_wait:g} s (speak_segments' full_wait); {err}"
                    ) from None
            rng.set_state(state)
            time.sleep(pause)
            pause = min(2 * pause, _FULL_POLL_S[1])

    def done(self, index: int, frames: int, budget: int) -> None:
        """Segment ``index`` took ``frames`` of its ``budget``."""
        self.previous_frames = frames
        if self.on_segment is not None:
            self.on_segment(index, frames, budget)


class _Utterance(Iterator[AudioChunk]):
    """The streamed chunks of :func:`speak_segments`: one streaming vocoder over every segment, each segment
    submitted as the previous one ends (the first when this is made). :meth:`close` (or dropping it) cancels
    the segment under way; :meth:`cancel` does from any thread."""

    def __init__(self, plan: _Plan, kwargs: dict):
        from zonos.codec.streaming import StreamingDACDecoder

        model = plan.model
        self.plan = plan
        self.kwargs = dict(kwargs, stream=True, emit_prefix=False)
        self.decoder = StreamingDACDecoder(model.autoencoder, cuda_graphs=model.engine.vocoder_graphs)
        self.segments = plan.segments()
        self.last = len(plan.segments_text) - 1
        self.handle, self.cancelled, self.closed = None, False, False
        self._submit_next(plan.prefix_codes)
        self._chunks = self._run()

    def _submit_next(self, previous: torch.Tensor | None) -> bool:
        """Submit the next segment, continuing ``previous``; False after the last."""
        step = None if self.cancelled else next(self.segments, None)
        if step is None:
            return False
        self.k, prefix, self.budget = step
        kwargs = dict(self.kwargs, decoder=self.decoder, flush=self.k == self.last)
        self.handle = None
        self.handle = self.plan.submit(self.k, prefix, previous, self.budget, kwargs)
        if self.cancelled:  # cancelled from another thread while this one submitted
            self.handle.cancel()
        return True

    def _run(self) -> Iterator[AudioChunk]:
        frames = samples = 0
        try:
            while True:
                new = []
                for chunk in self.handle:
                    new.append(chunk.codes)
                    n, m = chunk.codes.shape[-1], chunk.audio.shape[-1]
                    final = chunk.final and self.k == self.last
                    yield AudioChunk(chunk.audio, chunk.codes, (frames, frames + n), (samples, samples + m), final)
                    frames += n
                    samples += m
                _close(self.handle)
                if self.cancelled:
                    return
                previous = torch.cat(new, dim=-1) if new else None
                self.plan.done(self.k, 0 if previous is None else previous.shape[-1], self.budget)
                if not self._submit_next(previous):
                    return
        finally:
            self.close()

    def __iter__(self) -> Iterator[AudioChunk]:
        return self

    def __next__(self) -> AudioChunk:
        if self.closed:
            raise StopIteration
        return next(self._chunks)

    def cancel(self) -> None:
        """From any thread: the segment under way is cancelled (its chunks end) and no later one starts."""
        self.cancelled = True
        handle = self.handle
        if handle is not None:
            handle.cancel()

    def close(self) -> None:
        """Stop the utterance from the thread that reads it: :meth:`cancel`, and no more chunks. Idempotent."""
        self.cancel()
        self.closed = True
        if self.handle is not None:
            _close(self.handle)
        self.segments.close()

    def __del__(self) -> None:
        if hasattr(self, "segments"):
            self.close()


def _close(handle) -> None:
    """Cancel a segment's request if it still runs, and close its progress bar."""
    handle.cancel()
    if handle.request.progress is not None:
        handle.request.progress.close()
