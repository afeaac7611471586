#!/usr/bin/env python3
"""A streaming web demo for Zonos text-to-speech: Gradio controls, raw PCM to the browser, Web Audio playback.

Generate does not go through Gradio's audio component (ffmpeg, AAC and HLS segments added 1.5 s before the
first sound). The page's script (``zonos/demo_static/player.js``, served at ``zonos/player.js``) posts the
controls' values to ``POST /zonos/stream``, a route mounted beside the Gradio app; the route answers with a
stream of frames, float32 PCM as each :class:`zonos.streaming.AudioChunk` arrives, and the script schedules
every chunk on an ``AudioContext`` at once. The page shows the latency it measured (click to first sample
scheduled) beside the server's time to first audio. Text longer than one segment is split as ``zonos-tts
speak`` splits it (:func:`zonos.conditioning.segments.split_text`) and spoken as one utterance
(:func:`zonos.longform.speak_segments`). The same inputs, with named parameters, are the Gradio API endpoint
``/synthesize``, which returns the whole utterance as a wav file (so ``gradio_client`` gets audio back).

Example:
    pip install -e '.[demo]'          # also needs espeak-ng from the system's package manager
    python gradio_interface.py                                   # http://127.0.0.1:7860
    python gradio_interface.py --model ./my-zonos-dir --device cpu --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.resources
import inspect
import io
import json
import math
import os
import secrets
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:  # optional at import time, so `--help` and the helpers work without the demo extra
    import gradio as gr
    from fastapi import Request  # gradio's dependency; at module level so the route's annotation resolves
except ImportError:  # pragma: no cover - exercised only without the demo extra
    gr = Request = None

from zonos.audio import MAX_PREFIX_SECONDS
from zonos.cli.common import cute_scan_flag
from zonos.conditioning import make_cond_dict, normalize_language, supported_language_codes
from zonos.conditioning.phonemes import MAX_TEXT_CHARS
from zonos.conditioning.segments import DEFAULT_MAX_CHARS, split_text
from zonos.errors import EngineFullError, ZonosInputError
from zonos.longform import longform_budget, segment_budget, speak_segments
from zonos.model import DEFAULT_CHUNK_FRAMES, DEFAULT_FIRST_CHUNK_FRAMES, Zonos
from zonos.utils import HelpFormatter
from zonos.validation import describe

__all__ = [
    "DEFAULT_MODELS",
    "EMOTIONS",
    "FRAME_EVENT",
    "FRAME_PCM",
    "ModelLoader",
    "ModelCache",
    "SynthesisRequest",
    "build_app",
    "build_demo",
    "check_uploaded",
    "decode_frames",
    "encode_frame",
    "synthesis_events",
    "synthesize_audio",
    "to_int16",
    "parse_args",
    "main",
]

DEFAULT_MODELS = ("Zyphra/Zonos-v0.1-hybrid", "Zyphra/Zonos-v0.1-transformer")
DEFAULT_CODEC = "descript/dac_44khz"
# Upstream's demo defaults: (label, default weight) in the emotion conditioner's order.
EMOTIONS: tuple[tuple[str, float], ...] = (
    ("Happiness", 1.0),
    ("Sadness", 0.05),
    ("Disgust", 0.05),
    ("Fear", 0.05),
    ("Surprise", 0.05),
    ("Anger", 0.05),
    ("Other", 0.1),
    ("Neutral", 0.2),
)
# Conditioning keys the UI can switch to their learned unconditional vector (upstream's list and default).
UNCONDITIONAL_CHOICES = ("speaker", "emotion", "vqscore_8", "fmax", "pitch_std", "speaking_rate", "dnsmos_ovrl")
DEFAULT_UNCONDITIONAL = ("emotion",)
DEFAULT_TEXT = "Zonos uses eSpeak for text to phoneme conversion!"
# (text, language code) under the text box; the long one shows text split into segments and spoken as one.
EXAMPLES: tuple[tuple[str, str], ...] = (
    (DEFAULT_TEXT, "en-us"),
    ("Good morning! The first words play while the rest of this sentence is still being generated.", "en-us"),
    (
        "Long text is split at sentence ends into segments of a few hundred characters. Each segment continues "
        "the audio of the one before it, so the voice, the pace and the room sound stay the same from start to "
        "finish. You hear the first sentence within a moment, while later ones are still being written. A "
        "progress bar under the buttons shows how far along the request is, and the status line says when a "
        "segment ran out of frames before the model finished it. Press Stop at any time: the model is free for "
        "the next request straight away.",
        "en-us",
    ),
    ("Guten Tag! Dieser Satz wird auf Deutsch gesprochen.", "de"),
    ("Bonjour à tous, et merci d'avoir essayé cette démonstration.", "fr-fr"),
    ("こんにちは。今日はとても良い天気ですね。", "ja"),
)
MIN_SPEAKER_SECONDS = 0.5  # the speaker embedding's minimum; several seconds of clean speech work best
SILENT_RMS = 1e-4  # -80 dBFS: nothing to take a voice from
MAX_REQUEST_BYTES = 64 * 1024  # a stream request's JSON: MAX_TEXT_CHARS of UTF-8 and the controls fit in 20 KB
MAX_API_BODY_BYTES = 1024 * 1024  # a Gradio API call's JSON (uploads are multipart and not read as JSON)
MAX_UPLOAD_BYTES = 50 * 1024 * 1024  # Gradio refuses larger uploads (a 30 s float32 stereo wav at 48 kHz is 11 MB)
LOCK_TIMEOUT_S = 300.0  # how long a request waits in line for the model
CANCEL_POLL_S = 0.05  # how often a request waiting in line looks whether its client has gone
FIRST_SEND_WAIT_S = 0.25  # the most the decode loop waits for the route to write the first chunk
MAX_SEED = 2**32 - 1
FRAME_SECONDS = 512 / 44100  # one code frame: the codec's hop of 512 samples at 44.1 kHz

# The stream's framing: a little-endian (kind, payload bytes) header, then the payload. An event's payload is a
# UTF-8 JSON object with an "event" key (queued, start, first_audio, progress, done, error); a PCM payload is
# float32 samples.
FRAME_HEADER = struct.Struct("<II")
FRAME_EVENT = 1
FRAME_PCM = 2

ModelLoader = Callable[[str], Zonos]
"""Returns the loaded model for a name from the model dropdown (a Hub id or a local directory)."""

PLAYER_JS_PATH = importlib.resources.files("zonos") / "demo_static" / "player.js"
"""The page's player script (package data of ``zonos``, so an installed wheel has it)."""


class _Turn:
    """One request's place in a :class:`_Line`."""

    def __init__(self, line: _Line) -> None:
        self._line = line
        self.held = False

    def wait(self, timeout: float, cancel: threading.Event | None = None) -> Iterator[int]:
        """Wait for the model; yields how many requests are ahead of this one each time that number changes
        (never when the model is free at once). Afterwards :attr:`held` says whether this request holds the
        model; it does not when ``timeout`` seconds passed or ``cancel`` was set first, and it has left the line."""
        deadline = time.monotonic() + timeout
        told = 0
        cond, line = self._line.cond, self._line.turns
        while True:
            with cond:
                while True:
                    ahead = line.index(self)
                    if ahead == 0:
                        self.held = True
                        return
                    left = deadline - time.monotonic()
                    if left <= 0 or (cancel is not None and cancel.is_set()):
                        line.remove(self)
                        cond.notify_all()
                        return
                    if ahead != told:
                        break  # yielded outside the lock: the caller may take its time with the number
                    cond.wait(left if cancel is None else min(left, CANCEL_POLL_S))
            told = ahead
            yield ahead

    def leave(self) -> None:
        """Release the model, or leave the line (idempotent)."""
        with self._line.cond:
            if self in self._line.turns:
                self._line.turns.remove(self)
                self._line.cond.notify_all()
        self.held = False


class _Line:
    """One generation at a time, first come first served, with each waiting request's place in line: the model
    keeps one set of decode caches and one streaming vocoder for the demo. A request :meth:`join` s the line and
    waits for its :class:`_Turn`; a closed request leaves it at once, so the next one does not wait for it.
    ``acquire`` and ``release`` make it a plain lock for other work on the model (switching accelerators)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.turns: list[_Turn] = []  # the first holds the model

    def join(self) -> _Turn:
        turn = _Turn(self)
        with self.cond:
            self.turns.append(turn)
        return turn

    def acquire(self, timeout: float) -> bool:
        turn = self.join()
        for _ in turn.wait(timeout):
            pass
        return turn.held

    def release(self) -> None:
        with self.cond:
            self.turns.pop(0)
            self.cond.notify_all()

    def locked(self) -> bool:
        """Whether a request holds the model (or waits for it)."""
        with self.cond:
            return bool(self.turns)

    def waiting(self) -> int:
        """Requests in line behind the one that holds the model."""
        with self.cond:
            return max(0, len(self.turns) - 1)


_generation_lock = _Line()
_upload_cache: dict[tuple, torch.Tensor] = {}  # the last clips' embedding / codes, keyed by kind, model, file


def _require_gradio() -> Any:
    if gr is None:
        raise ImportError("the web demo needs gradio: pip install -e '.[demo]'")
    return gr


def to_int16(audio: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] to 16-bit PCM (clipped, rounded to nearest)."""
    return np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


# ------------------------------------------------------------------------------------------------ the request


@dataclasses.dataclass(frozen=True)
class SynthesisRequest:
    """Every control of the page, with the page's defaults; the Gradio API's parameters have these names.

    ``speaker_audio`` and ``prefix_audio`` are paths of uploaded clips (or None). ``model_name`` None means
    the first model offered. The sampler fields are :class:`zonos.sampling.SamplingParams`' (upstream's
    unified sampler: ``linear``, ``conf``, ``quad``).
    """

    text: str = DEFAULT_TEXT
    language: str = "en-us"
    model_name: str | None = None
    speaker_audio: str | None = None
    prefix_audio: str | None = None
    happiness: float = EMOTIONS[0][1]
    sadness: float = EMOTIONS[1][1]
    disgust: float = EMOTIONS[2][1]
    fear: float = EMOTIONS[3][1]
    surprise: float = EMOTIONS[4][1]
    anger: float = EMOTIONS[5][1]
    other: float = EMOTIONS[6][1]
    neutral: float = EMOTIONS[7][1]
    vq_score: float = 0.78
    fmax: float = 22050.0
    pitch_std: float = 45.0
    speaking_rate: float = 15.0
    dnsmos_ovrl: float = 4.0
    speaker_noised: bool = False
    unconditional_keys: tuple[str, ...] = DEFAULT_UNCONDITIONAL
    cfg_scale: float = 2.0
    temperature: float = 1.0
    linear: float = 0.5
    conf: float = 0.4
    quad: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 3.0
    seed: int = 420
    randomize_seed: bool = True
    max_new_tokens: int = 86 * 30

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SynthesisRequest:
        """Check the types of JSON or Gradio values (numbers may come as floats from sliders).

        Raises:
            ZonosInputError: an unknown name or a value of the wrong type, naming the field.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ZonosInputError(f"unknown request field(s) {unknown}; the fields are {sorted(fields)}")
        return cls(**{name: _coerce(name, value, fields[name].default) for name, value in values.items()})

    def sampling_params(self) -> dict[str, float]:
        """The ``sampling_params`` of ``Zonos.generate``."""
        names = ("temperature", "linear", "conf", "quad", "top_p", "top_k", "min_p", "repetition_penalty")
        return {name: getattr(self, name) for name in names}

    def emotion(self) -> list[float]:
        return [getattr(self, name.lower()) for name, _ in EMOTIONS]


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float's range (JSON allows 10**400)
        return False


def _coerce(name: str, value: Any, default: Any) -> Any:
    """``value`` as the type of the field's ``default`` (None defaults are optional strings)."""
    if default is None:
        if value is None or value == "":
            return None
        if isinstance(value, Mapping) and isinstance(value.get("path"), str):  # a Gradio FileData from the page
            return value["path"]
        if isinstance(value, str):
            return value
        raise ZonosInputError(f"{name} must be a string or null, got {type(value).__name__}")
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ZonosInputError(f"{name} must be true or false, got {value!r}")
    if isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            raise ZonosInputError(f"{name} must be a finite number, got {describe(value)}")
        if isinstance(default, int):
            if value != int(value):
                raise ZonosInputError(f"{name} must be a whole number, got {value!r}")
            return int(value)
        return float(value)
    if isinstance(default, tuple):
        if value is None:
            return ()
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ZonosInputError(f"{name} must be a list of strings, got {value!r}")
    if isinstance(value, str):
        return value
    raise ZonosInputError(f"{name} must be a string, got {type(value).__name__}")


# -------------------------------------------------------------------------------------------- uploaded clips


def check_uploaded(path: str, what: str = "clip") -> None:
    """Refuse ``path`` unless it is a file uploaded to this app (in Gradio's upload folder): a request must not
    make the server read, cache or serve any other file it can read. The one check of both the stream route and
    the Gradio API (:class:`_UploadsOnly`); its message names no server path.

    Raises:
        ZonosInputError: ``path`` is outside the upload folder (or not a path at all).
    """
    folder = Path(_require_gradio().utils.get_upload_folder()).resolve()
    try:
        inside = Path(path).resolve().is_relative_to(folder)
    except (OSError, TypeError, ValueError):  # not a string, a NUL byte, a loop of links
        inside = False
    if not inside:
        raise ZonosInputError(
            f"The {what} is not a file uploaded to this demo; upload it on the page (or with gradio_client's "
            "handle_file) and pass the path the upload returned."
        )


def _upload_key(kind: str, model: Zonos, path: str) -> tuple:
    try:
        stat = os.stat(path)
    except OSError as e:  # its strerror only: the message names no server path
        raise ZonosInputError(f"Could not read the {kind} audio ({e.strerror}); upload the clip again.") from None
    return (kind, id(model), path, stat.st_size, stat.st_mtime_ns)


def _read_clip(kind: str, path: str, max_seconds: float) -> tuple[torch.Tensor, int]:
    """The clip's first ``max_seconds`` (a small upload can decode to hours), checked for a usable sample rate
    and finite samples. Read from memory, so the messages name the clip, not its path on the server."""
    from zonos.audio import load_audio

    try:
        data = Path(path).read_bytes()
        wav, sr = load_audio(io.BytesIO(data), max_seconds=max_seconds, name="the file")
    except OSError as e:
        raise ZonosInputError(f"Could not read the {kind} audio ({e.strerror}); upload the clip again.") from None
    except ValueError as e:
        raise ZonosInputError(f"Could not read the {kind} audio: {e}") from e
    if not bool(torch.isfinite(wav).all()):
        raise ZonosInputError(f"The {kind} audio contains invalid (NaN or infinite) samples; export it again.")
    return wav, sr


def _remember(key: tuple, value: torch.Tensor) -> torch.Tensor:
    for old in [k for k in _upload_cache if k[0] == key[0]]:
        del _upload_cache[old]  # one clip of each kind: the cache must not grow with every upload
    _upload_cache[key] = value
    return value


def _speaker_embedding(model: Zonos, path: str) -> torch.Tensor:
    """Read and check a voice clip, then embed it (cached for the last clip)."""
    key = _upload_key("speaker", model, path)
    if key in _upload_cache:
        return _upload_cache[key]
    from zonos.speaker import MAX_SECONDS

    wav, sr = _read_clip("speaker", path, MAX_SECONDS)  # the embedding trims to MAX_SECONDS anyway
    seconds = wav.shape[-1] / sr if sr > 0 else 0.0
    if seconds < MIN_SPEAKER_SECONDS:
        raise ZonosInputError(
            f"The speaker audio is too short ({seconds:.2f} s); voice cloning needs at least "
            f"{MIN_SPEAKER_SECONDS} s, and 5-30 s of clean speech work best."
        )
    rms = float(wav.float().pow(2).mean().sqrt())
    if rms < SILENT_RMS:
        raise ZonosInputError(
            f"The speaker audio is silent (RMS {rms:.1e}); upload a recording of the voice to clone, "
            "or clear the speaker audio to use the default voice."
        )
    try:
        embedding = model.make_speaker_embedding(wav, sr)
    except (OSError, ValueError) as e:  # offline without the speaker model cached, or a clip it rejects
        raise ZonosInputError(f"Could not compute the speaker embedding: {e}") from e
    return _remember(key, embedding)


def _prefix_codes(model: Zonos, path: str) -> torch.Tensor:
    """The codes (1, 9, frames) of a clip the speech should continue (its first MAX_PREFIX_SECONDS, mono)."""
    key = _upload_key("prefix", model, path)
    if key in _upload_cache:
        return _upload_cache[key]
    wav, sr = _read_clip("prefix", path, MAX_PREFIX_SECONDS)
    wav = wav.mean(0, keepdim=True)
    codec = model.autoencoder
    try:
        codes = codec.encode(codec.preprocess(wav, sr)[None])
    except (TypeError, ValueError) as e:
        raise ZonosInputError(f"Could not encode the prefix audio: {e}") from e
    return _remember(key, codes)


# ---------------------------------------------------------------------------------------------- generation


def synthesis_events(
    model_loader: ModelLoader,
    model_names: Sequence[str],
    request: SynthesisRequest,
    *,
    first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
    chunk_frames: int = DEFAULT_CHUNK_FRAMES,
    cancel: threading.Event | None = None,
    t_request: float | None = None,
) -> Iterator[dict[str, Any] | np.ndarray]:
    """Speak one request; yields event dicts and float32 audio chunks (1-D numpy, the model's sample rate).

    The text is split as ``zonos-tts speak`` splits it (:func:`~zonos.conditioning.segments.split_text`, at most
    :data:`~zonos.conditioning.segments.DEFAULT_MAX_CHARS` characters a segment). One segment is one streamed
    ``generate`` with at most the frames :func:`~zonos.longform.segment_budget` leaves it; several are one
    utterance of :func:`~zonos.longform.speak_segments`, each segment given the frames
    :func:`~zonos.longform.longform_budget` guarantees. Both budgets are at most ``max_new_tokens``.

    The events, in order: ``queued`` (``ahead``: the requests before this one) whenever its place in line changes
    while other requests hold the model; ``start`` (seed, sample rate, device, prefix frames, ``segments``, the
    frame ``budget`` of each, conditioning time) once it is checked and conditioned; ``first_audio`` (server time
    to first audio from ``t_request``, a ``time.perf_counter()`` value, default now; and ``t_wall_ms``) just
    before the first chunk; ``progress`` after each chunk (``segment`` from 1 of ``segments``, and ``fraction``
    of the most frames the request may take); ``done`` at the end (samples, seconds, elapsed, real-time factor,
    ``stopped``; ``cut_off``, the segments from 1 that stopped at their budget before the model ended them, and
    ``warning``, the sentence saying so or None; ``t_end_wall_ms``). The wall-clock times compare with the
    browser's clock. Setting ``cancel`` takes a waiting request out of line (the stream ends with no event) and
    stops a running one after the current decode step (one segment) or chunk (several): the stream ends with
    ``done`` and ``stopped`` true. Closing the iterator early also stops it; either way the model is ready for
    the next request.

    Raises:
        ZonosInputError: bad input (before the ``start`` event; a length past ``max_seqlen`` after it), with
            the message to show.
        EngineFullError: the request waited LOCK_TIMEOUT_S in line.
    """
    t_request = time.perf_counter() if t_request is None else t_request
    cancel = cancel or threading.Event()
    segments, language, seed, name = _check_request(request, model_names)
    turn = _generation_lock.join()
    try:
        for ahead in turn.wait(LOCK_TIMEOUT_S, cancel):
            yield {"event": "queued", "ahead": ahead}
        if not turn.held:
            if cancel.is_set():
                return  # its client went away while it waited
            raise EngineFullError(
                f"The model was busy with other requests for {LOCK_TIMEOUT_S:.0f} s; try again in a moment."
            )
        try:
            model = model_loader(name)
        except (OSError, ValueError, RuntimeError) as e:
            raise ZonosInputError(f"Could not load the model {name!r}: {e}") from e
        cond, prefix_codes = _conditioning(model, request, language)
        prefix_frames = 0 if prefix_codes is None else prefix_codes.shape[-1]
        ended: list[int] = []  # the frames each finished segment took
        settings = dict(
            cfg_scale=request.cfg_scale,
            sampling_params=request.sampling_params(),
            progress_bar=False,
            generator=torch.Generator(device=model.device).manual_seed(seed),
            first_chunk_frames=first_chunk_frames,
            chunk_frames=chunk_frames,
        )
        try:
            if len(segments) == 1:
                prefix = model.prepare_conditioning(make_cond_dict(text=segments[0], **cond))
                budget = _segment_budget(model, prefix.shape[1], prefix_frames, request.max_new_tokens)
                stream = model.generate(
                    prefix,
                    audio_prefix_codes=prefix_codes,
                    max_new_tokens=budget,
                    callback=lambda *_: not cancel.is_set(),
                    stream=True,
                    **settings,
                )
            else:
                budget = longform_budget(model, segments, language, request.max_new_tokens, prefix_frames=prefix_frames)
                stream = speak_segments(
                    model,
                    segments,
                    cond=cond,
                    stream=True,
                    audio_prefix_codes=prefix_codes,
                    on_segment=lambda index, frames, most: ended.append(frames),
                    max_new_tokens=budget,
                    **settings,
                )
        except ValueError as e:  # e.g. all-zero emotions, or settings generate rejects
            raise ZonosInputError(str(e)) from e
        sr = model.autoencoder.sampling_rate
        t_start = time.perf_counter()
        yield {
            "event": "start",
            "seed": seed,
            "sample_rate": sr,
            "device": str(model.device),
            "prefix_frames": prefix_frames,
            "segments": len(segments),
            "budget": budget,
            "conditioning_ms": round(1000 * (t_start - t_request), 1),
        }
        samples = frames = 0
        try:
            for chunk in stream:
                frames = chunk.frames[1]
                audio = chunk.audio[0, 0].detach().float().cpu().numpy()
                if audio.size:
                    if samples == 0:
                        now = time.perf_counter()
                        yield {
                            "event": "first_audio",
                            "ttfa_ms": round(1000 * (now - t_request), 1),
                            "generation_ms": round(1000 * (now - t_start), 1),
                            "t_wall_ms": time.time() * 1000,
                        }
                    samples += audio.size
                    yield audio
                done_frames = max(0, frames - (prefix_frames if len(segments) == 1 else sum(ended)))
                yield {
                    "event": "progress",
                    "segment": len(ended) + 1,
                    "segments": len(segments),
                    "fraction": (len(ended) + min(1.0, done_frames / budget)) / len(segments),
                }
                if cancel.is_set():
                    break  # speak_segments takes no callback: a cancel ends it here, at a chunk
        except ValueError as e:  # checks the decode loop makes when it starts
            raise ZonosInputError(str(e)) from e
        finally:
            stream.close()  # a cancelled request stops generating here and resets the streaming vocoder
        stopped = cancel.is_set()
        if len(segments) == 1:
            ended = [frames - prefix_frames]
        cut = [] if stopped else [k + 1 for k, taken in enumerate(ended) if taken >= budget]
        elapsed = time.perf_counter() - t_start
        yield {
            "event": "done",
            "samples": samples,
            "seconds": samples / sr,
            "elapsed_s": elapsed,
            "rtf": samples / sr / max(elapsed, 1e-9),
            "stopped": stopped,
            "cut_off": cut,
            "warning": _cut_off_warning(cut, len(segments), budget, request.max_new_tokens, prefix_frames),
            "seed": seed,
            "t_end_wall_ms": time.time() * 1000,
        }
    finally:
        turn.leave()


def _check_request(request: SynthesisRequest, model_names: Sequence[str]) -> tuple[list[str], str, int, str]:
    """What is checked before a request joins the line: its (segments, language, seed, model name)."""
    text = request.text
    if not text.strip():
        raise ZonosInputError("The text is empty: type the sentence to speak.")
    if len(text) > MAX_TEXT_CHARS:
        raise ZonosInputError(
            f"The text is {len(text):,} characters; the demo speaks at most {MAX_TEXT_CHARS:,} a request. Split it "
            "and generate the parts one after another."
        )
    segments = split_text(text)
    try:
        language = normalize_language(request.language or "")
    except ValueError as e:
        raise ZonosInputError(f"{e} Pick a code from the Language dropdown.") from e
    seed = secrets.randbelow(MAX_SEED + 1) if request.randomize_seed else request.seed
    if not 0 <= seed <= MAX_SEED:
        raise ZonosInputError(f"The seed must be between 0 and {MAX_SEED}, got {seed}.")
    if request.max_new_tokens < 1:
        raise ZonosInputError(
            f"Max new tokens must be at least 1 (86 frames are about one second), got {request.max_new_tokens}."
        )
    name = request.model_name or model_names[0]
    if name not in model_names:
        raise ZonosInputError(f"Unknown model {name!r}; this demo serves {list(model_names)}.")
    return segments, language, seed, name


def _conditioning(model: Zonos, request: SynthesisRequest, language: str) -> tuple[dict, torch.Tensor | None]:
    """``make_cond_dict``'s arguments but the text, and the prefix clip's codes (None without one)."""
    unconditional = list(request.unconditional_keys)
    use_speaker = request.speaker_audio and "speaker" not in unconditional
    speaker = _speaker_embedding(model, request.speaker_audio) if use_speaker else None
    prefix_codes = _prefix_codes(model, request.prefix_audio) if request.prefix_audio else None
    cond = dict(
        language=language,
        speaker=speaker,
        emotion=request.emotion(),
        fmax=request.fmax,
        pitch_std=request.pitch_std,
        speaking_rate=request.speaking_rate,
        vqscore_8=[request.vq_score] * 8,
        dnsmos_ovrl=request.dnsmos_ovrl,
        speaker_noised=request.speaker_noised,
        unconditional_keys=unconditional,
        device=model.device,
    )
    return cond, prefix_codes


def _segment_budget(model: Zonos, prefix_length: int, prefix_frames: int, max_new_tokens: int) -> int:
    """The frames one segment may take after its prefix and the prefix clip's frames. (A text too long on its own
    was refused by ``prepare_conditioning``; what is left to refuse here is a text and a clip too long together.)"""
    max_seqlen = model.engine.max_seqlen
    try:
        return segment_budget(max_seqlen, prefix_length, prefix_frames, max_new_tokens=max_new_tokens)
    except ZonosInputError:
        raise ZonosInputError(
            f"The text takes {prefix_length} of the model's {max_seqlen} positions and the prefix audio "
            f"{prefix_frames}, which leaves no room for new audio: use a shorter prefix clip or shorter text."
        ) from None


def _cut_off_warning(cut: list[int], segments: int, budget: int, asked: int, prefix_frames: int) -> str | None:
    """The page's sentence for segments ``cut`` (from 1) that stopped at their ``budget`` of frames before the
    model ended them (``asked``: the request's max_new_tokens); None when none did."""
    if not cut:
        return None
    if segments == 1:
        where, them = "the text", "it"
    elif len(cut) == segments:
        where, them = f"every segment of {segments}", "them"
    else:
        numbers = ", ".join(map(str, cut))
        where, them = (f"segment {numbers}", "it") if len(cut) == 1 else (f"segments {numbers}", "them")
        where += f" of {segments}"
    seconds = budget * FRAME_SECONDS
    if budget < asked:
        limit = f"the {budget} frames ({seconds:.1f} s) the model's positions leave {'it' if segments == 1 else 'each'}"
        fix = "use a shorter prefix clip" if prefix_frames else "raise the Speaking rate or generate the text in parts"
    else:
        limit = f"Max new tokens ({budget} frames, {seconds:.1f} s)"
        fix = "raise Max new tokens (under Sampling) or try another seed"
    return f"{where} reached {limit} before the model ended {them}, so the audio may stop early; {fix}."


def synthesize_audio(
    model_loader: ModelLoader,
    model_names: Sequence[str],
    request: SynthesisRequest,
    cancel: threading.Event | None = None,
    **schedule: int,
) -> tuple[tuple[int, np.ndarray], dict[str, Any]]:
    """The whole utterance: ``((sample_rate, int16 samples), done event)`` (what the Gradio API returns);
    ``cancel`` as :func:`synthesis_events` takes it."""
    sr, pieces, done = 0, [], {}
    for item in synthesis_events(model_loader, model_names, request, cancel=cancel, **schedule):
        if isinstance(item, np.ndarray):
            pieces.append(item)
        elif item["event"] == "start":
            sr = item["sample_rate"]
        elif item["event"] == "done":
            done = item
    audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    return (sr, to_int16(audio)), done


def encode_frame(kind: int, payload: bytes) -> bytes:
    """One frame of the stream route's body."""
    return FRAME_HEADER.pack(kind, len(payload)) + payload


def _frame(item: dict[str, Any] | np.ndarray) -> bytes:
    if isinstance(item, np.ndarray):
        return encode_frame(FRAME_PCM, np.ascontiguousarray(item, dtype="<f4").tobytes())
    return encode_frame(FRAME_EVENT, json.dumps(item).encode())


def decode_frames(body: bytes) -> list[dict[str, Any] | np.ndarray]:
    """The events and float32 chunks of a complete stream body (for Python clients and tests)."""
    out, pos = [], 0
    while pos < len(body):
        kind, size = FRAME_HEADER.unpack_from(body, pos)
        payload = body[pos + FRAME_HEADER.size : pos + FRAME_HEADER.size + size]
        if len(payload) != size:
            raise ValueError(f"truncated stream: a frame of {size} bytes has {len(payload)}")
        pos += FRAME_HEADER.size + size
        out.append(json.loads(payload) if kind == FRAME_EVENT else np.frombuffer(payload, dtype="<f4"))
    return out


class _StreamJob:
    """Runs :func:`synthesis_events` on a worker thread, handing its frames to the event loop's queue.

    A closed connection (the browser pressed Stop or went away) cancels the request at once, from the moment the
    job starts: while it waits in line or is conditioned, too. ``receive`` (the request's ASGI channel) says so,
    where a failed write would only tell at the next chunk.

    After the first audio chunk the worker waits (at most FIRST_SEND_WAIT_S) until the route has written it:
    a decode loop that keeps the GIL busy (the CPU, tiny models) otherwise delays the event loop's send by
    one 5 ms switch interval per GIL hand-over, 150-300 ms in all on a 2-core CPU. Later chunks are not waited
    for; they are due only when the audio before them has played.
    """

    def __init__(
        self, events: Iterator[dict[str, Any] | np.ndarray], cancel: threading.Event, receive: Callable[[], Any]
    ) -> None:
        self.cancel = cancel
        self.first_sent = threading.Event()
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self._events = events
        self._watcher = asyncio.ensure_future(self._watch(receive))
        threading.Thread(target=self._run, name="zonos-stream", daemon=True).start()

    async def _watch(self, receive: Callable[[], Any]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.cancel.set()

    def close(self) -> None:
        """Stop the request (if it still runs) and the watch on its connection."""
        self.cancel.set()
        self._watcher.cancel()

    def _put(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def _run(self) -> None:
        try:
            with contextlib.closing(self._events):
                for item in self._events:
                    self._put(item)
                    if isinstance(item, np.ndarray) and not self.first_sent.is_set():
                        self.first_sent.wait(FIRST_SEND_WAIT_S)
                        self.first_sent.set()
        except Exception as e:  # handed to the route, which answers with the message
            self._put(e)
        finally:
            self._put(None)

    async def frames(self, first: bytes) -> Any:
        """The response body: ``first`` (the frames the route waited for), then each item as it comes."""
        try:
            yield first
            self.first_sent.set()  # the server has written it: the worker goes on generating
            while (item := await self.queue.get()) is not None:
                if isinstance(item, Exception):
                    yield _frame({"event": "error", "message": _message(item)})
                    break
                yield _frame(item)
        finally:
            self.close()


def _message(error: Exception) -> str:
    """What the page shows for ``error``: an input error's message, else its type only (the traceback goes to the
    demo's log, not to whoever sent the request: it may name server paths)."""
    if isinstance(error, (ValueError, EngineFullError)):  # ZonosInputError is a ValueError
        return str(error)
    traceback.print_exception(error, file=sys.stderr)
    return f"The server failed ({type(error).__name__}); the traceback is in the demo's log. Try again."


class _UploadsOnly:
    """ASGI middleware: a request body holding a Gradio file object (``{"path": ..., "meta": {"_type":
    "gradio.FileData"}}``) is refused with 400 unless :func:`check_uploaded` accepts its path. Gradio copies
    such a file into its cache, where it can be downloaded, before any event function runs, and checks that it
    was uploaded only in an app it launched itself, not in one mounted as this demo is."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable[[], Any], send: Callable[[dict], Any]) -> None:
        headers = dict(scope.get("headers") or [])
        if (
            scope["type"] != "http"
            or scope["method"] in ("GET", "HEAD", "OPTIONS")
            or headers.get(b"content-type", b"").startswith(b"multipart/")  # uploads: files, not paths
        ):
            await self.app(scope, receive, send)
            return
        messages, body = [], bytearray()
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if len(body) > MAX_API_BODY_BYTES:
                await _answer(send, 413, f"the request is over {MAX_API_BODY_BYTES} bytes")
                return
            if not message.get("more_body"):
                break
        try:
            from gradio_client.utils import is_file_obj_with_meta, traverse

            traverse(json.loads(body), lambda d: check_uploaded(d["path"], "file") or d, is_file_obj_with_meta)
        except ZonosInputError as e:
            await _answer(send, 400, str(e))
            return
        except RecursionError:  # nested too deep to look through: not passed on unchecked
            await _answer(send, 400, "the request body's JSON is nested too deeply")
            return
        except ValueError:  # not JSON: Gradio reads no file objects from it
            pass

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


async def _answer(send: Callable[[dict], Any], status: int, message: str) -> None:
    body = json.dumps({"error": message, "detail": message}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------------------------------------------ UI


PLAYER_HTML = """
<div id="zonos-player">
  <div id="zonos-status" role="status" aria-live="polite" aria-atomic="true">Ready: press Generate.</div>
  <progress id="zonos-progress" max="1" aria-label="Generation progress" hidden></progress>
  <div id="zonos-latency"></div>
  <audio id="zonos-replay" controls hidden></audio>
  <a id="zonos-download" download="zonos.wav" hidden>Download wav</a>
</div>
"""

# The character counter under the text box; the player's count() fills it as the text changes.
COUNTER_HTML = f'<div id="zonos-chars" data-max="{MAX_TEXT_CHARS}" data-segment="{DEFAULT_MAX_CHARS}"></div>'

# Status kinds (set by the player): an error in red with a bar beside it, a cut-off result in amber, so neither
# reads as success at a glance.
CSS = """
#zonos-player { padding: 6px 4px; font-size: 0.95em; min-height: 3.2em; }
#zonos-status { font-weight: 600; padding-left: 6px; border-left: 4px solid transparent; }
#zonos-status[data-kind="done"] { border-left-color: var(--color-green-500, #22c55e); }
#zonos-status[data-kind="warning"] { color: var(--color-yellow-700, #a16207); border-left-color: #eab308; }
#zonos-status[data-kind="error"] { color: var(--error-text-color, #b91c1c); border-left-color: #dc2626; }
#zonos-progress { width: 100%; height: 8px; margin-top: 4px; }
#zonos-latency { color: var(--body-text-color-subdued); }
#zonos-replay { width: 100%; height: 32px; margin-top: 4px; }
#zonos-chars { color: var(--body-text-color-subdued); font-size: 0.85em; text-align: right; }
#zonos-chars[data-kind="error"] { color: var(--error-text-color, #b91c1c); }
"""


def _accelerator_info(device: torch.device, can_switch: bool) -> str | None:
    if device.type != "cuda":
        return f"needs a CUDA GPU; this demo runs on {device}"
    if not can_switch:
        return "the model loader cannot switch accelerators"
    return None


def build_demo(
    model_loader: ModelLoader,
    model_names: Sequence[str] = DEFAULT_MODELS,
    first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
    chunk_frames: int = DEFAULT_CHUNK_FRAMES,
    device: str | torch.device | None = None,
    defaults: SynthesisRequest | None = None,
) -> Any:
    """Build the Gradio Blocks app (serve it with :func:`build_app`, which adds the stream route it plays from).

    Args:
        model_loader: called with the model dropdown's value (one of ``model_names``) on every request;
            returns the loaded :class:`Zonos` (cache it: see :class:`ModelCache`). A loader with a
            ``set_accelerators(**flags)`` method (as :class:`ModelCache` has) lets the page switch them.
        model_names: the dropdown's choices (Hub ids or local directories); the first is the default.
        first_chunk_frames, chunk_frames: the streaming schedule passed to ``Zonos.generate``.
        device: shown on the page; default the loader's ``device`` attribute, else the default device.
        defaults: the controls' initial values (and the API's defaults); default ``SynthesisRequest()``.

    Returns:
        a ``gradio.Blocks``. Its API endpoint ``/synthesize`` takes :class:`SynthesisRequest`'s fields as
        named parameters and returns the utterance as a wav file.
    """
    gr_ = _require_gradio()
    if not model_names:
        raise ValueError("model_names is empty: give at least one Hub id or local model directory")
    from zonos.utils import default_device

    model_names = list(model_names)
    device = torch.device(device or getattr(model_loader, "device", None) or default_device())
    set_accelerators = getattr(model_loader, "set_accelerators", None)
    schedule = {"first_chunk_frames": first_chunk_frames, "chunk_frames": chunk_frames}
    d = defaults or SynthesisRequest()

    with gr_.Blocks(title="Zonos streaming TTS") as demo:
        gr_.Markdown(
            f"### Zonos streaming text-to-speech · device **{device}**\n"
            "Audio plays from the first chunk the model makes; the line under the buttons says how long that took."
        )
        with gr_.Row(equal_height=False):
            with gr_.Column(scale=3):
                text = gr_.Textbox(
                    label="Text to synthesize",
                    value=d.text,
                    lines=3,
                    max_lines=8,
                    max_length=MAX_TEXT_CHARS,
                    elem_id="zonos-text",
                )
                gr_.HTML(COUNTER_HTML, min_height=0)
                with gr_.Row():
                    language = gr_.Dropdown(supported_language_codes, value=d.language, label="Language code")
                    model_name = gr_.Dropdown(model_names, value=model_names[0], label="Model")
                with gr_.Row():
                    generate = gr_.Button("Generate", variant="primary", elem_id="zonos-generate")
                    stop = gr_.Button("Stop", elem_id="zonos-stop")
                gr_.HTML(PLAYER_HTML)
                gr_.Examples([list(e) for e in EXAMPLES], inputs=[text, language], label="Example texts")
            with gr_.Column(scale=2):
                with gr_.Tab("Voice"):
                    speaker_audio = gr_.Audio(
                        label="Speaker audio to clone (optional, 5-30 s of speech)",
                        type="filepath",
                        sources=["upload", "microphone"],
                        elem_id="zonos-speaker",
                    )
                    speaker_noised = gr_.Checkbox(label="Denoise speaker (hybrid only)", value=d.speaker_noised)
                with gr_.Tab("Prefix"):
                    prefix_audio = gr_.Audio(
                        label=f"Prefix audio to continue (optional; its first {MAX_PREFIX_SECONDS:.0f} s)",
                        type="filepath",
                        sources=["upload", "microphone"],
                        elem_id="zonos-prefix",
                    )
                with gr_.Tab("Accelerators"):
                    reason = _accelerator_info(device, set_accelerators is not None)
                    flags = dict(getattr(model_loader, "accelerators", {}))
                    on_gpu = reason is None
                    toggles = [
                        gr_.Checkbox(
                            label=label,
                            value=on_gpu and (_on_by_default(key) if flags.get(key) is None else flags[key]),
                            interactive=on_gpu,
                            info=reason or hint,
                        )
                        for key, label, hint in (
                            ("use_cute_gemv", "CuTe GEMV", "CuTeDSL skinny GEMVs for the decode projections"),
                            ("use_cute_scan", "CuTe scan", "CuTeDSL Mamba2 SSD scan for the prefill"),
                            ("cuda_graphs", "CUDA graphs", "replay the decode step and prefill as CUDA graphs"),
                            ("fast_ops", "Fast ops", "Triton kernels for the backbone's ops"),
                        )
                    ]
                    accel_status = gr_.Markdown("")
        with gr_.Accordion("Sampling", open=False):
            with gr_.Row():
                cfg_scale = gr_.Slider(1.0, 5.0, value=d.cfg_scale, step=0.1, label="CFG scale (1 turns guidance off)")
                temperature = gr_.Slider(0.0, 2.0, value=d.temperature, step=0.05, label="Temperature (0: greedy)")
                repetition_penalty = gr_.Slider(
                    1.0, 5.0, value=d.repetition_penalty, step=0.1, label="Repetition penalty (1: off)"
                )
            with gr_.Row():
                linear = gr_.Slider(0.0, 2.0, value=d.linear, step=0.01, label="Unified: linear (0 turns it off)")
                conf = gr_.Slider(-2.0, 2.0, value=d.conf, step=0.01, label="Unified: confidence")
                quad = gr_.Slider(-2.0, 2.0, value=d.quad, step=0.01, label="Unified: quadratic")
            with gr_.Row():
                top_p = gr_.Slider(0.0, 1.0, value=d.top_p, step=0.01, label="Top p (0: off)")
                top_k = gr_.Slider(0, 1024, value=d.top_k, step=1, label="Top k (0: off)")
                min_p = gr_.Slider(0.0, 1.0, value=d.min_p, step=0.01, label="Min p (0: off)")
            with gr_.Row():
                seed = gr_.Number(label="Seed", value=d.seed, precision=0, elem_id="zonos-seed")
                randomize_seed = gr_.Checkbox(label="Randomize seed", value=d.randomize_seed)
                max_new_tokens = gr_.Slider(
                    1, 86 * 30, value=d.max_new_tokens, step=1, label="Max new tokens (86 ≈ one second)"
                )
        with gr_.Accordion("Conditioning", open=False):
            with gr_.Row():
                fmax = gr_.Slider(0, 24000, value=d.fmax, step=1, label="Fmax (Hz); 22050 is best for cloning")
                pitch_std = gr_.Slider(0.0, 300.0, value=d.pitch_std, step=1, label="Pitch std (20-45 normal)")
                speaking_rate = gr_.Slider(5.0, 30.0, value=d.speaking_rate, step=0.5, label="Speaking rate")
            with gr_.Row():
                vq_score = gr_.Slider(0.5, 0.8, value=d.vq_score, step=0.01, label="VQ score (hybrid only)")
                dnsmos = gr_.Slider(1.0, 5.0, value=d.dnsmos_ovrl, step=0.1, label="DNSMOS overall (hybrid only)")
            unconditional_keys = gr_.CheckboxGroup(
                list(UNCONDITIONAL_CHOICES),
                value=list(d.unconditional_keys),
                label="Unconditional keys (use the model's learned default instead of the control)",
            )
        with gr_.Accordion("Emotion (uncheck 'emotion' under Conditioning for these to take effect)", open=False):
            with gr_.Row():
                emotions = [gr_.Slider(0.0, 1.0, value=v, step=0.05, label=name) for name, v in EMOTIONS[:4]]
            with gr_.Row():
                emotions += [gr_.Slider(0.0, 1.0, value=v, step=0.05, label=name) for name, v in EMOTIONS[4:]]
        api_audio = gr_.Audio(type="numpy", format="wav", visible=False, label="Generated audio")
        api_trigger = gr_.Button(visible=False)

        controls = {
            "text": text,
            "language": language,
            "model_name": model_name,
            "speaker_audio": speaker_audio,
            "prefix_audio": prefix_audio,
            **{name.lower(): slider for (name, _), slider in zip(EMOTIONS, emotions)},
            "vq_score": vq_score,
            "fmax": fmax,
            "pitch_std": pitch_std,
            "speaking_rate": speaking_rate,
            "dnsmos_ovrl": dnsmos,
            "speaker_noised": speaker_noised,
            "unconditional_keys": unconditional_keys,
            "cfg_scale": cfg_scale,
            "temperature": temperature,
            "linear": linear,
            "conf": conf,
            "quad": quad,
            "top_p": top_p,
            "top_k": top_k,
            "min_p": min_p,
            "repetition_penalty": repetition_penalty,
            "seed": seed,
            "randomize_seed": randomize_seed,
            "max_new_tokens": max_new_tokens,
        }
        names = list(controls)

        async def synthesize(*values: Any) -> tuple[int, np.ndarray]:
            # On a worker thread, so that Gradio cancelling the event (the page closed, its cancel route) reaches
            # the finally below and stops generation instead of leaving a thread to run the utterance out.
            cancel = threading.Event()
            try:
                request = SynthesisRequest.from_mapping(dict(zip(names, values)))
                for clip, what in ((request.speaker_audio, "speaker audio"), (request.prefix_audio, "prefix audio")):
                    if clip is not None:
                        check_uploaded(clip, what)
                audio, done = await asyncio.to_thread(
                    synthesize_audio, model_loader, model_names, request, cancel, **schedule
                )
            except (ValueError, EngineFullError) as e:
                raise gr_.Error(str(e)) from e
            finally:
                cancel.set()
            if done.get("warning"):
                gr_.Warning(f"Cut off: {done['warning']}")
            return audio

        # Named parameters (with the page's defaults) for the API page and gradio_client.
        synthesize.__signature__ = inspect.Signature(
            [
                inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=_api_default(name, d))
                for name in names
            ]
        )
        api_trigger.click(synthesize, inputs=list(controls.values()), outputs=api_audio, api_name="synthesize")
        generate.click(
            None,
            inputs=list(controls.values()),
            outputs=seed,
            # The player's promise resolves as the stream starts, with the seed used; every click is taken at once
            # ("multiple"): a click while one is pending replaces that request.
            js=f"(...values) => window.zonosPlayer.start({json.dumps(names)}, values)",
            trigger_mode="multiple",
            show_progress="hidden",
            api_visibility="private",
        )
        stop.click(None, js="() => window.zonosPlayer.stop()", api_visibility="private")
        count = "(text) => { window.zonosPlayer.count(text); }"
        text.change(None, inputs=text, js=count, api_visibility="private")  # typed, or filled from an example
        demo.load(None, inputs=text, js=count, api_visibility="private")

        def switch(name: str, use_cute_gemv: bool, use_cute_scan: bool, cuda_graphs: bool, fast_ops: bool) -> str:
            if reason is not None:
                raise gr_.Error(f"Accelerators are unavailable: {reason}.")
            wanted = {
                "use_cute_gemv": use_cute_gemv,
                "use_cute_scan": use_cute_scan,
                "cuda_graphs": cuda_graphs,
                "fast_ops": fast_ops,
            }
            if not _generation_lock.acquire(timeout=LOCK_TIMEOUT_S):
                raise gr_.Error("The model is busy with another request; try again in a moment.")
            try:
                set_accelerators(name, **wanted)
            except (ImportError, RuntimeError, ValueError) as e:
                raise gr_.Error(f"Could not switch accelerators: {e}") from e
            finally:
                _generation_lock.release()
            on = [k for k, v in wanted.items() if v]
            return f"On: {', '.join(on) or 'none'}. The next request captures new graphs where needed."

        for toggle in toggles:
            toggle.input(switch, inputs=[model_name, *toggles], outputs=accel_status, api_visibility="private")
    return demo


def _api_default(name: str, d: SynthesisRequest) -> Any:
    value = getattr(d, name)
    return list(value) if isinstance(value, tuple) else value


def build_app(
    model_loader: ModelLoader,
    model_names: Sequence[str] = DEFAULT_MODELS,
    first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
    chunk_frames: int = DEFAULT_CHUNK_FRAMES,
    device: str | torch.device | None = None,
    defaults: SynthesisRequest | None = None,
) -> Any:
    """The ASGI app to serve: the stream route and the page's script, with :func:`build_demo` mounted at ``/``.

    ``POST /zonos/stream`` takes a JSON object of :class:`SynthesisRequest` fields (uploaded clips as paths
    in Gradio's upload folder) and answers 400 with ``{"error": message}`` for bad input, else a stream of
    frames (see :data:`FRAME_HEADER`) that ends with a ``done`` or ``error`` event; a request that waits for
    the model starts the stream at once with ``queued`` events. Closing the connection stops generation, or
    takes a waiting request out of line. Every route refuses a file path that was not uploaded
    (:func:`check_uploaded`).
    """
    gr_ = _require_gradio()
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    model_names = list(model_names)
    demo = build_demo(model_loader, model_names, first_chunk_frames, chunk_frames, device, defaults)
    schedule = {"first_chunk_frames": first_chunk_frames, "chunk_frames": chunk_frames}
    player_js = PLAYER_JS_PATH.read_text(encoding="utf-8")
    app = FastAPI()
    app.add_middleware(_UploadsOnly)

    @app.get("/zonos/player.js")
    def player() -> Response:
        return Response(player_js, media_type="text/javascript")

    @app.post("/zonos/stream")
    async def stream(http: Request) -> Response:
        t_request = time.perf_counter()
        body = bytearray()
        async for part in http.stream():  # counted as it arrives: a client may send no Content-Length
            body += part
            if len(body) > MAX_REQUEST_BYTES:
                message = f"the request is over {MAX_REQUEST_BYTES} bytes; text is at most {MAX_TEXT_CHARS} characters"
                return JSONResponse({"error": message}, status_code=413)
        try:
            values = json.loads(body)
            if not isinstance(values, dict):
                raise ZonosInputError("the request body must be a JSON object of the demo's fields")
            request = SynthesisRequest.from_mapping(values)
            for clip, what in ((request.speaker_audio, "speaker audio"), (request.prefix_audio, "prefix audio")):
                if clip is not None:
                    check_uploaded(clip, what)
        except ValueError as e:  # ZonosInputError and JSON errors are ValueErrors
            return JSONResponse({"error": str(e)}, status_code=400)
        cancel = threading.Event()
        events = synthesis_events(model_loader, model_names, request, cancel=cancel, t_request=t_request, **schedule)
        job = _StreamJob(events, cancel, http.receive)
        # Answer once the first audio (or the end) is there, in one write: a request refused as it starts still
        # gets a 400, and nothing could play sooner anyway. A request that must wait in line is answered at once,
        # so the page can say where it stands; an error after that is the stream's error event.
        head: list[dict[str, Any] | np.ndarray] = []
        while not head or (isinstance(head[-1], dict) and head[-1]["event"] in ("start", "first_audio")):
            item = await job.queue.get()
            if item is None or isinstance(item, Exception):
                if item is not None:
                    await job.queue.get()  # the worker's end marker: the model is released
                job.close()
                if item is None:  # it ended before it started: its client went away while it waited
                    return JSONResponse({"error": "the request was cancelled"}, status_code=499)
                status = 400 if isinstance(item, ValueError) else 503 if isinstance(item, EngineFullError) else 500
                return JSONResponse({"error": _message(item)}, status_code=status)
            head.append(item)
        return StreamingResponse(
            job.frames(b"".join(map(_frame, head))),
            media_type="application/octet-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return gr_.mount_gradio_app(
        app,
        demo,
        path="/",
        max_file_size=MAX_UPLOAD_BYTES,
        css=CSS,
        head='<script src="zonos/player.js"></script>',
    )


# ------------------------------------------------------------------------------------------ loading models


class ModelCache:
    """A :data:`ModelLoader` that keeps one model in memory: asking for another frees the current one first.

    The DAC codec is loaded once, on first use, and shared by every model. ``accelerators`` (keyword
    arguments of :meth:`Zonos.use_accelerators`) are applied after each load and changed by
    :meth:`set_accelerators`. ``warmup`` (default: on CUDA) runs :meth:`Zonos.warmup` with the demo's chunk
    schedule, the page's default sampler settings and every prefill piece size after each load, so no
    visitor waits for kernel compilation or graph capture.
    """

    def __init__(
        self,
        codec: str = DEFAULT_CODEC,
        device: str | torch.device | None = None,
        warmup: bool | None = None,
        first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
        chunk_frames: int = DEFAULT_CHUNK_FRAMES,
        accelerators: Mapping[str, bool | None] | None = None,
    ) -> None:
        from zonos.utils import default_device
        from zonos.validation import check_device

        self.codec_name = codec
        self.device = check_device("device", device) if device else default_device()
        self.warmup = self.device.type == "cuda" if warmup is None else warmup
        self.schedule = {"first_chunk_frames": first_chunk_frames, "chunk_frames": chunk_frames}
        self.accelerators = dict(accelerators or {})
        self._codec = None
        self._name: str | None = None
        self._model: Zonos | None = None
        self._lock = threading.Lock()

    def __call__(self, name: str) -> Zonos:
        """The model for ``name`` (a Hub id or a local directory with config.json and model.safetensors)."""
        from zonos.codec import DACAutoencoder

        with self._lock:
            if self._model is not None and self._name == name:
                return self._model
            speaker_model = self._model.spk_clone_model if self._model is not None else None
            self._model, self._name = None, None  # free the previous model before loading the next
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if self._codec is None:
                self._codec = DACAutoencoder.from_pretrained(self.codec_name, device=self.device)
            t0 = time.perf_counter()
            model = Zonos.from_pretrained(name, device=self.device, autoencoder=self._codec)
            if self.accelerators:
                model.use_accelerators(**self.accelerators)
            model.spk_clone_model = speaker_model  # the speaker embedding model serves every model
            self._model, self._name = model, name
            print(f"loaded {name} on {self.device} in {time.perf_counter() - t0:.1f} s", flush=True)
            if self.warmup:
                # Graphs are keyed by the sampler settings: capture those of the page's defaults.
                sampling = SynthesisRequest().sampling_params()
                seconds = model.warmup(all_prefill_lengths=True, sampling_params=sampling, **self.schedule)
                print(f"warmed up {name} in {seconds:.1f} s", flush=True)
            return model

    def set_accelerators(self, name: str, **flags: bool) -> None:
        """Apply :meth:`Zonos.use_accelerators` flags to the model ``name`` now and to every later load."""
        self(name).use_accelerators(**flags)
        self.accelerators.update(flags)


# ---------------------------------------------------------------------------------------------- the command


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see ``python gradio_interface.py --help``)."""
    p = argparse.ArgumentParser(
        description="Serve a streaming Zonos text-to-speech web demo. The browser plays raw PCM with Web Audio "
        "from the first chunk the model makes, and shows the latency it measured.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="ID_OR_DIR",
        help="a model for the dropdown: Hugging Face repo id (Zyphra/Zonos-v0.1-hybrid or "
        "Zyphra/Zonos-v0.1-transformer) or a local directory holding config.json and model.safetensors. "
        "Repeat to offer several; the first is loaded at start-up, the others when picked (one is kept in "
        f"memory). Default: {' and '.join(DEFAULT_MODELS)}",
    )
    p.add_argument(
        "--codec",
        default=DEFAULT_CODEC,
        help="the DAC codec: Hugging Face repo id or a local directory with config.json and model.safetensors",
    )
    p.add_argument("--device", default=None, help="torch device, e.g. cuda, cuda:1 or cpu (default: cuda if available)")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 serves other machines (e.g. in Docker)"
    )
    p.add_argument("--port", type=int, default=7860, help="port to listen on")
    p.add_argument(
        "--first-chunk-frames",
        type=int,
        default=DEFAULT_FIRST_CHUNK_FRAMES,
        help="frames in the first audio chunk (after the vocoder's ~10-frame lookahead); 86 frames ≈ 1 s",
    )
    p.add_argument(
        "--chunk-frames",
        type=int,
        default=DEFAULT_CHUNK_FRAMES,
        help="frames in the steady chunks; the chunks after the first double in size until they reach it",
    )
    p.add_argument("--cute-gemv", action="store_true", help="CUDA: decode projections through the CuTeDSL GEMVs")
    scan = p.add_mutually_exclusive_group()
    scan.add_argument(
        "--cute-scan",
        action="store_true",
        help="CUDA: require the prefill's SSD scan on the CuTeDSL kernel (without either flag: on where it can run)",
    )
    scan.add_argument(
        "--no-cute-scan", action="store_true", help="CUDA: the prefill's SSD scan on mamba_ssm's kernels or torch"
    )
    p.add_argument("--no-cuda-graphs", action="store_true", help="CUDA: run the decode step eagerly")
    p.add_argument("--no-fast-ops", action="store_true", help="CUDA: the torch reference ops instead of Triton")
    p.add_argument("--no-preload", action="store_true", help="load the first model on the first request, not at start")
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the warm-up after each model load (on CUDA it compiles kernels and captures graphs up front, "
        "~40 s the first time on a machine, ~7 s once the kernel caches are warm: every prefill length is captured)",
    )
    args = p.parse_args(argv)
    args.model = args.model or list(DEFAULT_MODELS)
    for name in ("first_chunk_frames", "chunk_frames"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.port < 65536:
        p.error(f"--port must be in 1..65535, got {args.port}")
    if args.device is not None:
        from zonos.validation import check_device

        try:
            check_device("--device", args.device)
        except ValueError as e:  # 'mps' or 'cuda' where there is none, or no device name at all
            p.error(str(e))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, load the first model and serve the demo until interrupted; 2 if it cannot load."""
    import uvicorn

    args = parse_args(argv)
    _require_gradio()
    from zonos.utils import default_device

    if (torch.device(args.device) if args.device else default_device()).type == "cuda":
        from zonos_accel.kernel_cache import use_kernel_cache

        try:
            use_kernel_cache()  # before anything compiles: kernels kept on disk for the next start
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    loader = ModelCache(
        codec=args.codec,
        device=args.device,
        warmup=False if args.no_warmup else None,
        first_chunk_frames=args.first_chunk_frames,
        chunk_frames=args.chunk_frames,
        accelerators=_accelerator_flags(args),
    )
    if not args.no_preload:
        try:
            loader(args.model[0])
        except (OSError, ValueError, ImportError) as e:  # a bad model, codec, device or accelerator flag
            print(f"error: could not load {args.model[0]}: {e}", file=sys.stderr)
            return 2
    app = build_app(loader, args.model, args.first_chunk_frames, args.chunk_frames)
    print(f"serving the demo on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _on_by_default(flag: str) -> bool:
    """What None (the loader's default) means for an accelerator flag on a GPU: on for graphs and fast ops, on for
    the CuTe scan where nvidia-cutlass-dsl is installed, off for the CuTe GEMV."""
    if flag == "use_cute_gemv":
        return False
    if flag == "use_cute_scan":
        from zonos_accel.ssd import cute_scan_available

        return cute_scan_available()
    return True


def _accelerator_flags(args: argparse.Namespace) -> dict[str, bool | None]:
    return {
        "use_cute_gemv": args.cute_gemv,
        "use_cute_scan": cute_scan_flag(args),
        "cuda_graphs": False if args.no_cuda_graphs else None,
        "fast_ops": False if args.no_fast_ops else None,
    }


if __name__ == "__main__":
    raise SystemExit(main())
