"""The speech server: an OpenAI-compatible streaming HTTP API on the engine (FastAPI; run it with uvicorn).

Endpoints:

- ``POST /v1/audio/speech``: OpenAI's request (``model``, ``input``, ``voice``, ``response_format``, ``speed``,
  ``stream_format``); audio goes out in chunks as the engine's frames complete. ``speed`` scales Zonos'
  speaking rate (15 at speed 1, capped at 40). Audio is mono 44.1 kHz (48 kHz for opus); ``pcm`` is 16-bit
  little-endian without a header.
- ``POST /v1/zonos/speech``: the same stream with every Zonos control (language, emotion, fmax, pitch, rate,
  quality targets, unconditional keys, seed, CFG, sampling, frame budget, chunk schedule, an inline speaker clip
  and prefix audio to continue, both base64).
- ``GET /v1/audio/voices`` lists voices; ``POST /v1/audio/voices`` (multipart: ``name``, ``file``) stores a clip's
  speaker embedding under a name (a voice file as ``zonos-tts voice`` writes it).
- ``GET /health`` (no key needed) and ``GET /metrics`` (Prometheus text).

Safe defaults (:class:`ServerSettings`): the CLI binds 127.0.0.1; an optional bearer API key; text up to 4096
characters; body and upload limits; a per-key request rate. Bad input is answered 4xx with an OpenAI-style JSON
error (``{"error": {"message", "type", "param", "code"}}``), a full engine queue 503 with ``Retry-After``, and a
client that goes away cancels its request (its slot is free at the engine's next step).

Text longer than one generation is split with :func:`zonos.conditioning.segments.split_text` and spoken segment
after segment as one stream (``zonos.longform.speak_segments`` takes over when that module exists). A request
seeded with ``seed`` gives the same samples as ``model.generate(..., stream=True)`` with
``torch.Generator().manual_seed(seed)`` and the same chunk schedule, whatever else the server runs.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import importlib
import io
import json
import math
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from zonos.audio import MAX_PREFIX_SECONDS
from zonos.errors import EngineClosedError, EngineFullError, ZonosInputError
from zonos.serve.encode import MEDIA_TYPES, OPUS_RATE, SAMPLE_RATE, StreamEncoder, available_formats

__all__ = ["ApiError", "ServerSettings", "create_app"]

# OpenAI's built-in voice names; a client that sends one gets the default voice unless a stored voice has the name.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse")
DEFAULT_VOICE = "default"  # the model's learned unconditional speaker
VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TTFA_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)
FRAMES_PER_SECOND = SAMPLE_RATE / 512
_END = object()


@dataclass
class ServerSettings:
    """What the server allows and how it runs the engine.

    Attributes:
        api_key: bearer token every request but ``/health`` must carry (None: no key).
        model_name: the name ``/v1/models``-style clients see; any ``model`` value is accepted.
        voices_dir: where ``POST /v1/audio/voices`` stores voice files (None: no stored voices, uploads refused).
        max_input_chars: longest ``input`` text (OpenAI's limit).
        max_body_bytes: largest JSON body of ``/v1/audio/speech``.
        max_upload_bytes: largest body of the endpoints that take audio (voices, native speech).
        rate_limit: requests per minute per API key (or per client address without a key); None: no limit.
        slots, vocoder_batching, queue_size, max_seqlen: the engine's (``model.start_engine``); slots None keeps the
            model's engine.
        max_new_tokens: most frames one text segment may take (also capped by the engine's ``max_seqlen``).
        segment_chars: long text is split into segments of at most this many characters (~14 s of English each,
            so that ``zonos.longform``'s segments, which carry the previous one, fit 4096 positions).
        retry_after_s: the ``Retry-After`` of a 503.
        warmup: on CUDA, compile kernels and capture graphs before taking requests.
        logits_processor: given to every request (``Zonos.generate``'s argument), e.g. a load test's EOS
            suppression so that every request runs ``max_new_tokens`` frames.
    """

    api_key: str | None = None
    model_name: str = "zonos"
    voices_dir: Path | None = None
    max_input_chars: int = 4096
    max_body_bytes: int = 64 * 1024
    max_upload_bytes: int = 16 * 2**20
    rate_limit: float | None = 120.0
    slots: int | None = 8
    vocoder_batching: bool = True
    queue_size: int = 64
    max_seqlen: int | None = None
    max_new_tokens: int = 86 * 30
    segment_chars: int = 200
    retry_after_s: int = 1
    warmup: bool = True
    logits_processor: Callable | None = None

    def __post_init__(self) -> None:
        if self.rate_limit is not None and not (math.isfinite(self.rate_limit) and self.rate_limit > 0):
            raise ZonosInputError(f"rate_limit must be None (no limit) or requests a minute > 0, got {self.rate_limit}")
        for name in ("max_input_chars", "max_body_bytes", "max_upload_bytes", "queue_size", "max_new_tokens",
                     "segment_chars"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ZonosInputError(f"ServerSettings.{name} must be a positive int, got {value!r}")


class ApiError(HTTPException):
    """An error answered as JSON: ``status``, a message that says what to do, OpenAI's ``type`` and ``code``. (An
    HTTPException, so FastAPI passes it through when it is raised while the body is parsed.)"""

    def __init__(self, status: int, message: str, code: str, param: str | None = None, headers: dict | None = None):
        super().__init__(status, message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return {401: "authentication_error", 429: "rate_limit_error", 503: "server_busy"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error"
        )

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


# ------------------------------------------------------------------------------------------ requests


class SpeechRequest(BaseModel):
    """OpenAI's ``/v1/audio/speech`` body (unknown fields, e.g. ``instructions``, are ignored)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    input: str
    voice: str = DEFAULT_VOICE
    response_format: str = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"


class ZonosSpeechRequest(BaseModel):
    """``/v1/zonos/speech``: every Zonos control (see ``zonos.conditioning.make_cond_dict``); unknown fields are
    an error, so a misspelt control does not pass unnoticed."""

    model_config = ConfigDict(extra="forbid")
    input: str
    language: str = "en-us"
    voice: str = DEFAULT_VOICE
    speaker_audio: str | None = Field(None, description="a voice clip to clone, base64 (wav/flac/ogg/mp3)")
    prefix_audio: str | None = Field(None, description="audio to continue, base64; its codes lead the first segment")
    emotion: list[float] | None = None
    fmax: float = 22050.0
    pitch_std: float = 20.0
    speaking_rate: float = 15.0
    vqscore_8: list[float] | None = None
    ctc_loss: float = 0.0
    dnsmos_ovrl: float = 4.0
    speaker_noised: bool = False
    unconditional_keys: list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    cfg_scale: float = Field(2.0, gt=0)
    sampling: dict[str, float] | None = None
    max_new_tokens: int | None = Field(None, ge=1)
    first_chunk_frames: int | None = Field(None, ge=1)
    chunk_frames: int | None = Field(None, ge=1)
    response_format: str = "wav"
    stream_format: Literal["audio", "sse"] = "audio"


@dataclass
class _Spec:
    """A speech request as the service runs it."""

    text: str
    voice: str
    response_format: str
    stream_format: str
    cond: dict
    seed: int | None = None
    cfg_scale: float = 2.0
    sampling: dict | None = None
    max_new_tokens: int | None = None
    first_chunk_frames: int | None = None
    chunk_frames: int | None = None
    speaker_audio: bytes | None = None
    prefix_audio: bytes | None = None


# ------------------------------------------------------------------------------------------- metrics


class _Metrics:
    """Counters the ``/metrics`` endpoint prints in Prometheus' text format."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ttfa = [0] * (len(TTFA_BUCKETS) + 1)
        self.ttfa_sum = 0.0
        self.ttfa_count = 0
        self.requests: dict[tuple[str, int], int] = {}
        self.streams = 0  # HTTP streams open
        self.audio_seconds = 0.0

    def observe_ttfa(self, seconds: float) -> None:
        with self.lock:
            i = next((k for k, edge in enumerate(TTFA_BUCKETS) if seconds <= edge), len(TTFA_BUCKETS))
            self.ttfa[i] += 1
            self.ttfa_sum += seconds
            self.ttfa_count += 1

    def count(self, route: str, status: int) -> None:
        with self.lock:
            self.requests[route, status] = self.requests.get((route, status), 0) + 1

    def render(self, engine) -> str:
        lines = [
            "# HELP zonos_ttfa_seconds Time from a speech request's arrival to its first audio bytes.",
            "# TYPE zonos_ttfa_seconds histogram",
        ]
        with self.lock:
            total = 0
            for edge, n in zip((*TTFA_BUCKETS, math.inf), self.ttfa):
                total += n
                le = "+Inf" if edge == math.inf else repr(edge)
                lines.append(f'zonos_ttfa_seconds_bucket{{le="{le}"}} {total}')
            lines += [f"zonos_ttfa_seconds_sum {self.ttfa_sum}", f"zonos_ttfa_seconds_count {self.ttfa_count}"]
            lines += ["# HELP zonos_requests_total Requests answered, by route and status.",
                      "# TYPE zonos_requests_total counter"]
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'zonos_requests_total{{route="{route}",status="{status}"}} {n}')
            streams, audio = self.streams, self.audio_seconds
        lines += [
            "# HELP zonos_streams_open Speech responses being streamed.",
            "# TYPE zonos_streams_open gauge",
            f"zonos_streams_open {streams}",
            "# HELP zonos_audio_seconds_total Seconds of audio streamed.",
            "# TYPE zonos_audio_seconds_total counter",
            f"zonos_audio_seconds_total {audio}",
        ]
        if engine is not None:
            lines += [
                "# HELP zonos_engine_active Requests in the engine's slots.",
                "# TYPE zonos_engine_active gauge",
                f"zonos_engine_active {engine.active}",
                "# HELP zonos_engine_queued Requests waiting for a slot.",
                "# TYPE zonos_engine_queued gauge",
                f"zonos_engine_queued {engine.queued}",
                "# HELP zonos_engine_slots Decode slots.",
                "# TYPE zonos_engine_slots gauge",
                f"zonos_engine_slots {engine.slots.count}",
                "# HELP zonos_engine_steps_total Decode steps run.",
                "# TYPE zonos_engine_steps_total counter",
                f"zonos_engine_steps_total {engine.steps}",
                "# HELP zonos_engine_step_seconds_total Host seconds in decode steps (over steps_total: step time).",
                "# TYPE zonos_engine_step_seconds_total counter",
                f"zonos_engine_step_seconds_total {engine.step_seconds}",
            ]
        return "\n".join(lines) + "\n"


class _RateLimiter:
    """A token bucket per key: ``per_minute`` requests a minute, bursts up to the same number."""

    def __init__(self, per_minute: float | None):
        self.rate = None if per_minute is None else per_minute / 60.0
        self.capacity = per_minute or 0.0
        self.buckets: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def take(self, key: str) -> float:
        """0 when the request may go, else the seconds until it could."""
        if self.rate is None:
            return 0.0
        now = time.monotonic()
        with self.lock:
            if len(self.buckets) > 10_000:  # forget keys whose buckets have refilled (many clients over time)
                full = self.capacity / self.rate
                self.buckets = {k: v for k, v in self.buckets.items() if now - v[1] < full}
            tokens, last = self.buckets.get(key, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.rate)
            if tokens >= 1:
                self.buckets[key] = (tokens - 1, now)
                return 0.0
            self.buckets[key] = (tokens, now)
            return (1 - tokens) / self.rate


# ------------------------------------------------------------------------------------------- service


class _Job:
    """One speech response: its engine handle (the current segment's), a queue the feeder thread fills with
    audio pieces, and cancellation from the response side."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.handle = None
        self.cancelled = False
        self.lock = threading.Lock()

    def put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def attach(self, handle) -> bool:
        """Make ``handle`` the current one; False (and the handle cancelled) when the job was cancelled."""
        with self.lock:
            self.handle = handle
            if self.cancelled:
                handle.cancel()
                return False
            return True

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            if self.handle is not None:
                self.handle.cancel()


class _Service:
    """The model, its engine and the work behind the routes."""

    def __init__(self, model, settings: ServerSettings):
        self.model = model
        self.settings = settings
        # Conditioning, speaker embeddings and codec encodes of the requests run one at a time (each is short, and
        # at once they would share the CPU's threads); the engine's decode runs on its own thread beside them.
        self.condition_lock = threading.Lock()
        self.voices: dict[str, torch.Tensor] = {}
        self.formats = available_formats()

    @property
    def engine(self):
        return self.model.engine

    # voices

    def voice_path(self, name: str) -> Path | None:
        if self.settings.voices_dir is None:
            return None
        return Path(self.settings.voices_dir) / f"{name}.pt"

    def voice_names(self) -> list[str]:
        d = self.settings.voices_dir
        stored = sorted(p.stem for p in Path(d).glob("*.pt")) if d is not None and Path(d).is_dir() else []
        return [DEFAULT_VOICE, *stored]

    def speaker(self, name: str) -> torch.Tensor | None:
        """The embedding of voice ``name`` (None: the default voice)."""
        from zonos.cli import UsageError, load_voice

        path = self.voice_path(name) if VOICE_NAME.fullmatch(name) else None
        if path is not None and path.is_file():
            try:
                return load_voice(path)
            except UsageError as e:
                message = f"voice {name!r}: its file is unreadable ({e}); store it again"
                raise ApiError(500, message, "bad_voice_file") from None
        if name == DEFAULT_VOICE or name in OPENAI_VOICES:
            return None
        raise ApiError(
            400,
            f"voice {name!r} is unknown; GET /v1/audio/voices lists them, and POST /v1/audio/voices stores a new one",
            "unknown_voice",
            "voice",
        )

    def embed_clip(self, data: bytes, param: str) -> torch.Tensor:
        from zonos.speaker import MAX_SECONDS, MIN_SECONDS

        wav, sr = _read_clip(data, param, MAX_SECONDS)  # the embedding trims to MAX_SECONDS anyway

        if wav.shape[-1] < MIN_SECONDS * sr:
            raise ApiError(
                400, f"{param}: {wav.shape[-1] / sr:.2f} s is too short; a voice needs {MIN_SECONDS} s of speech",
                "clip_too_short", param,
            )
        with self.condition_lock, torch.inference_mode():
            return self.model.make_speaker_embedding(wav, sr).detach().cpu()

    def store_voice(self, name: str, data: bytes, filename: str | None) -> dict:
        from zonos.cli import save_voice

        if self.settings.voices_dir is None:
            raise ApiError(400, "this server stores no voices: start it with a voices directory", "no_voices_dir")
        if not VOICE_NAME.fullmatch(name) or name == DEFAULT_VOICE:
            raise ApiError(
                400, f"name {name!r}: use 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit "
                f"(and not {DEFAULT_VOICE!r})", "bad_voice_name", "name",
            )
        embedding = self.embed_clip(data, "file")
        Path(self.settings.voices_dir).mkdir(parents=True, exist_ok=True)
        save_voice(self.voice_path(name), embedding, clip=filename or "", source="zonos-tts serve")
        return {"name": name, "object": "voice"}

    # speech

    def check(self, spec: _Spec) -> None:
        """Cheap checks, before any model work."""
        if not spec.text.strip():
            raise ApiError(400, "input is empty: give the text to speak", "empty_input", "input")
        if len(spec.text) > self.settings.max_input_chars:
            raise ApiError(
                400, f"input is {len(spec.text)} characters; at most {self.settings.max_input_chars} are allowed per "
                "request: split the text", "input_too_long", "input",
            )
        if spec.response_format not in self.formats:
            raise ApiError(
                400, f"response_format {spec.response_format!r} is not available here; choose one of "
                f"{', '.join(self.formats)}", "bad_response_format", "response_format",
            )

    def prepare(self, spec: _Spec) -> dict:
        """Everything up to the first segment's submit (on a worker thread): speaker, segments, prefix audio."""
        from zonos.conditioning import make_cond_dict
        from zonos.conditioning.segments import split_text

        segments = split_text(spec.text, self.settings.segment_chars)
        # Every segment's conditioning inputs, checked before the clips are decoded and before the answer's 200: a
        # long text's later segments were first conditioned after the response had begun, so their errors came
        # as an empty 200 (the phonemes are cached for the conditioning that follows).
        for text in segments:
            make_cond_dict(text=text, device="cpu", **spec.cond)
        if len(segments) > 1 and _longform() is not None:
            self.longform_budget(spec, segments)  # the slots must hold two segments' text with room for audio
        if spec.speaker_audio:
            speaker = self.embed_clip(spec.speaker_audio, "speaker_audio")
        else:
            speaker = self.speaker(spec.voice)
        codes = None
        if spec.prefix_audio:
            wav, sr = _read_clip(spec.prefix_audio, "prefix_audio", MAX_PREFIX_SECONDS)
            ae = self.model.autoencoder
            with self.condition_lock, torch.inference_mode():
                wav = ae.preprocess(wav.mean(0, keepdim=True)[None].to(self.model.device), sr)
                codes = ae.encode(wav)
        seed = spec.seed if spec.seed is not None else secrets.randbelow(2**63)
        return dict(
            speaker=speaker, segments=segments, prefix_codes=codes, seed=seed,
            generator=torch.Generator().manual_seed(seed),
        )

    def submit_segment(self, spec: _Spec, plan: dict, text: str, first: bool):
        """Condition ``text`` and submit it to the engine; returns the handle."""
        from zonos.conditioning import make_cond_dict
        from zonos.model import DEFAULT_CHUNK_FRAMES, DEFAULT_FIRST_CHUNK_FRAMES

        model = self.model
        with self.condition_lock, torch.inference_mode():
            cond = make_cond_dict(text=text, speaker=plan["speaker"], device=model.device, **spec.cond)
            prefix = model.prepare_conditioning(cond)
        codes = plan["prefix_codes"] if first else None
        audio = 0 if codes is None else codes.shape[2]
        room = self.engine.max_seqlen - prefix.shape[1] - audio - 9
        budget = min(spec.max_new_tokens or self.settings.max_new_tokens, self.settings.max_new_tokens, room)
        if budget < 1:
            raise ZonosInputError(
                f"a segment's text takes {prefix.shape[1]} and the prefix audio {audio} of the model's "
                f"{self.engine.max_seqlen} positions, leaving no room for new audio: shorten the prefix audio or the "
                "text"
            )
        return model.submit(
            prefix,
            audio_prefix_codes=codes,
            stream=True,
            max_new_tokens=budget,
            cfg_scale=spec.cfg_scale,
            sampling_params=spec.sampling,
            generator=plan["generator"],
            first_chunk_frames=spec.first_chunk_frames or DEFAULT_FIRST_CHUNK_FRAMES,
            chunk_frames=spec.chunk_frames or DEFAULT_CHUNK_FRAMES,
            logits_processor=self.settings.logits_processor,
        )

    def feed(self, job: _Job, spec: _Spec, plan: dict, handle) -> None:
        """The feeder thread: the first segment's chunks (``handle``), then each later segment's (conditioned and
        submitted in turn), into ``job``'s queue as float32 arrays; an error, then the end marker. ``handle`` None:
        the segments go to ``zonos.longform.speak_segments`` as one utterance."""
        try:
            if handle is None:  # long text, spoken by zonos.longform
                self._feed_longform(job, spec, plan, _longform())
                return
            for i, text in enumerate(plan["segments"]):
                if i:
                    handle = self._submit_waiting(job, spec, plan, text)
                    if handle is None:
                        return
                if not job.attach(handle):
                    return
                for chunk in handle:
                    job.put(chunk.audio[0, 0].float().cpu().numpy())
        except Exception as err:  # noqa: BLE001 - the response side reports it
            job.put(err)
        finally:
            job.put(_END)

    def _feed_longform(self, job: _Job, spec: _Spec, plan: dict, speak) -> None:
        gen = dict(max_new_tokens=self.longform_budget(spec, plan["segments"]), cfg_scale=spec.cfg_scale,
                   sampling_params=spec.sampling, generator=plan["generator"], progress_bar=False,
                   logits_processor=self.settings.logits_processor)
        for key in ("first_chunk_frames", "chunk_frames"):
            if getattr(spec, key):
                gen[key] = getattr(spec, key)
        cond = dict(spec.cond, speaker=plan["speaker"], device=self.model.device)
        chunks = speak(self.model, plan["segments"], cond=cond, stream=True, **gen)
        try:
            for chunk in chunks:
                if job.cancelled:
                    return
                job.put(chunk.audio[0, 0].float().cpu().numpy())
        finally:
            chunks.close()

    def longform_budget(self, spec: _Spec, segments: list[str]) -> int:
        """Frames per segment for ``zonos.longform``: a segment's request holds the previous segment's frames and
        both texts' prefix besides its own frames, so each gets at most half of what the prefix leaves. The prefix
        is bounded by 2 tokens per character of the two texts plus 64 (the conditioning's fixed tokens): English
        gives ~1.5 per character (TEXT in tests/test_serve.py: 28 characters, 43 tokens)."""
        pairs = [len(a) + len(b) for a, b in zip(["", *segments[:-1]], segments)]
        room = (self.engine.max_seqlen - 9 - (2 * max(pairs) + 64)) // 2
        if room < 1:
            raise ZonosInputError(
                f"the engine's {self.engine.max_seqlen} positions leave no room for long-form segments of "
                f"{self.settings.segment_chars} characters: lower segment_chars or raise max_seqlen"
            )
        return min(spec.max_new_tokens or self.settings.max_new_tokens, self.settings.max_new_tokens, room)

    def _submit_waiting(self, job: _Job, spec: _Spec, plan: dict, text: str):
        """A later segment's submit; a full queue is waited out (the stream has begun), a cancel ends it."""
        while not job.cancelled:
            try:
                return self.submit_segment(spec, plan, text, first=False)
            except EngineFullError:
                time.sleep(0.05)
        return None


def _longform() -> Callable | None:
    """``zonos.longform.speak_segments`` when that module exists."""
    try:
        module = importlib.import_module("zonos.longform")
    except ModuleNotFoundError as e:
        if e.name != "zonos.longform":
            raise
        return None
    return getattr(module, "speak_segments", None)


def _read_clip(data: bytes, param: str, max_seconds: float) -> tuple[torch.Tensor, int]:
    """An uploaded clip's first ``max_seconds`` (a small upload can decode to hours of audio)."""
    from zonos.audio import load_audio

    try:
        wav, sr = load_audio(io.BytesIO(data), max_seconds=max_seconds, name=param)
    except ZonosInputError as e:  # unreadable, or a sample rate out of range: load_audio's message says which
        raise ApiError(400, str(e), "bad_audio", param) from None
    if wav.shape[-1] == 0:
        raise ApiError(400, f"{param}: the audio file has no samples", "bad_audio", param)
    return wav, sr


def _b64(value: str, param: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ApiError(400, f"{param}: not valid base64", "bad_base64", param) from None


# --------------------------------------------------------------------------------------------- app


def create_app(load_model: Callable[[], Any], settings: ServerSettings | None = None) -> FastAPI:
    """The speech server's FastAPI app. ``load_model()`` returns a loaded :class:`zonos.model.Zonos`; it runs (on
    a worker thread) when the app starts, then the engine is created from ``settings`` and, on CUDA, warmed up.
    ``/health`` answers 503 until then."""
    settings = settings or ServerSettings()
    instance = secrets.token_hex(4)  # names this server (a replica) in responses' X-Zonos-Instance
    metrics = _Metrics()
    limiter = _RateLimiter(settings.rate_limit)
    state: dict[str, _Service | None] = {"service": None}

    def start() -> _Service:
        model = load_model()
        if settings.slots is not None:
            model.start_engine(
                slots=settings.slots,
                max_seqlen=settings.max_seqlen,
                queue_size=settings.queue_size,
                vocoder_batching=settings.vocoder_batching,
            )
        if settings.warmup and model.device.type == "cuda":
            model.warmup(progress_bar=False, all_prefill_lengths=True)
        return _Service(model, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["service"] = await asyncio.to_thread(start)
        yield
        service, state["service"] = state["service"], None
        if service is not None and settings.slots is not None:  # the engine this app created
            await asyncio.to_thread(service.model._engine.shutdown)

    app = FastAPI(title="Zonos text-to-speech", lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.zonos = state

    def service() -> _Service:
        s = state["service"]
        if s is None:
            raise ApiError(503, "the model is still loading; retry shortly", "loading",
                           headers={"Retry-After": str(settings.retry_after_s)})
        return s

    # errors

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        metrics.count(request.url.path, err.status)
        return err.response()

    @app.exception_handler(ZonosInputError)
    async def _input_error(request: Request, err: ZonosInputError):
        return await _api_error(request, ApiError(400, str(err), "invalid_input"))

    @app.exception_handler(EngineFullError)
    async def _full(request: Request, err: EngineFullError):
        return await _api_error(request, ApiError(
            503, f"the server is at capacity ({err}); retry after {settings.retry_after_s} s", "engine_full",
            headers={"Retry-After": str(settings.retry_after_s)},
        ))

    @app.exception_handler(EngineClosedError)
    async def _closed(request: Request, err: EngineClosedError):
        return await _api_error(request, ApiError(503, "the server is shutting down", "shutting_down",
                                                  headers={"Retry-After": str(settings.retry_after_s)}))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message = "the body is not valid JSON: send a JSON object (Content-Type: application/json)"
            code = "bad_json"
        else:
            message = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid')}"
            code = "invalid_value"
        return await _api_error(request, ApiError(400, message, code, ".".join(loc) or None))

    app.add_middleware(_Limits, settings=settings, limiter=limiter, metrics=metrics)

    # routes

    @app.get("/health")
    async def health():
        s = state["service"]
        if s is None:
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "5"})
        engine = s.engine
        return {"status": "ok", "model": settings.model_name, "slots": engine.slots.count, "active": engine.active,
                "queued": engine.queued, "formats": s.formats}

    @app.get("/metrics")
    async def prometheus():
        s = state["service"]
        return PlainTextResponse(metrics.render(s.engine if s else None), media_type="text/plain; version=0.0.4")

    @app.get("/v1/audio/voices")
    async def list_voices():
        s = service()
        return {"object": "list", "data": [{"name": n, "object": "voice"} for n in s.voice_names()],
                "aliases": {"default": list(OPENAI_VOICES)}}

    @app.post("/v1/audio/voices")
    async def add_voice(name: Annotated[str, Form()], file: Annotated[UploadFile, File()]):
        s = service()
        data = await file.read()
        result = await asyncio.to_thread(s.store_voice, name, data, file.filename)
        metrics.count("/v1/audio/voices", 200)
        return result

    @app.post("/v1/audio/speech")
    async def speech(body: SpeechRequest, request: Request):
        spec = _Spec(
            text=body.input, voice=body.voice, response_format=body.response_format, stream_format=body.stream_format,
            cond=dict(speaking_rate=min(15.0 * body.speed, 40.0)),
        )
        return await _speak(request, spec)

    @app.post("/v1/zonos/speech")
    async def zonos_speech(body: ZonosSpeechRequest, request: Request):
        cond: dict[str, Any] = dict(
            language=body.language, fmax=body.fmax, pitch_std=body.pitch_std, speaking_rate=body.speaking_rate,
            ctc_loss=body.ctc_loss, dnsmos_ovrl=body.dnsmos_ovrl, speaker_noised=body.speaker_noised,
        )
        for key in ("emotion", "vqscore_8"):
            if getattr(body, key) is not None:
                cond[key] = getattr(body, key)
        if body.unconditional_keys is not None:
            cond["unconditional_keys"] = set(body.unconditional_keys)
        if body.sampling is not None:
            from zonos.sampling import SamplingParams

            SamplingParams.from_dict(body.sampling)  # a bad setting is a 400 before any work
        spec = _Spec(
            text=body.input, voice=body.voice, response_format=body.response_format, stream_format=body.stream_format,
            cond=cond, seed=body.seed, cfg_scale=body.cfg_scale, sampling=body.sampling,
            max_new_tokens=body.max_new_tokens, first_chunk_frames=body.first_chunk_frames,
            chunk_frames=body.chunk_frames,
            speaker_audio=_b64(body.speaker_audio, "speaker_audio") if body.speaker_audio else None,
            prefix_audio=_b64(body.prefix_audio, "prefix_audio") if body.prefix_audio else None,
        )
        return await _speak(request, spec)

    async def _speak(request: Request, spec: _Spec) -> StreamingResponse:
        arrived = time.perf_counter()
        s = service()
        s.check(spec)
        plan = await asyncio.to_thread(s.prepare, spec)
        longform = len(plan["segments"]) > 1 and _longform() is not None
        handle = None if longform else await asyncio.to_thread(s.submit_segment, spec, plan, plan["segments"][0], True)
        job = _Job(asyncio.get_running_loop())
        job.handle = handle
        threading.Thread(target=s.feed, args=(job, spec, plan, handle), name="zonos-serve-feed", daemon=True).start()
        metrics.count(request.url.path, 200)
        rate = OPUS_RATE if spec.response_format == "opus" else SAMPLE_RATE
        headers = {"X-Zonos-Seed": str(plan["seed"]), "X-Sample-Rate": str(rate), "X-Zonos-Instance": instance,
                   "Cache-Control": "no-store"}
        if spec.stream_format == "sse":
            return _JobResponse(job, _sse(job, spec, arrived), media_type="text/event-stream", headers=headers)
        return _JobResponse(job, _audio(job, spec, arrived), media_type=MEDIA_TYPES[spec.response_format],
                            headers=headers)

    async def _pieces(job: _Job, arrived: float) -> AsyncIterator[np.ndarray]:
        """The job's audio pieces; leaving early (a client gone) cancels the request."""
        with metrics.lock:
            metrics.streams += 1
        first = True
        try:
            while True:
                item = await job.queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                if first and item.size:
                    metrics.observe_ttfa(time.perf_counter() - arrived)
                    first = False
                with metrics.lock:
                    metrics.audio_seconds += item.size / SAMPLE_RATE
                yield item
        finally:
            job.cancel()
            with metrics.lock:
                metrics.streams -= 1

    async def _audio(job: _Job, spec: _Spec, arrived: float) -> AsyncIterator[bytes]:
        encoder = StreamEncoder(spec.response_format)
        async for piece in _pieces(job, arrived):
            data = encoder.encode(piece)
            if data:
                yield data
        tail = encoder.finish()
        if tail:
            yield tail

    async def _sse(job: _Job, spec: _Spec, arrived: float) -> AsyncIterator[str]:
        encoder = StreamEncoder(spec.response_format)
        samples = 0

        def event(payload: dict) -> str:
            return f"data: {json.dumps(payload)}\n\n"

        try:
            async for piece in _pieces(job, arrived):
                samples += piece.size
                data = encoder.encode(piece)
                if data:
                    yield event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        except Exception as err:  # noqa: BLE001 - the stream has begun: the error goes out as an event
            yield event({"type": "error", "error": {"message": str(err), "type": "server_error"}})
            return
        tail = encoder.finish()
        if tail:
            yield event({"type": "speech.audio.delta", "audio": base64.b64encode(tail).decode()})
        frames = round(samples / 512)
        yield event({"type": "speech.audio.done", "usage": {"input_tokens": len(spec.text), "output_tokens": frames,
                                                            "total_tokens": len(spec.text) + frames}})

    return app


class _JobResponse(StreamingResponse):
    """A streamed speech response that cancels its request however it ends, also when the client went away
    before the body began (then the body's generator never runs, so its own cleanup would not either)."""

    def __init__(self, job: _Job, content, **kwargs):
        super().__init__(content, **kwargs)
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


class _Limits:
    """ASGI middleware: the body limit (a declared length at once, a chunked body as it arrives), the API key and
    the request rate, before any route runs."""

    UPLOAD_PATHS = frozenset({"/v1/audio/voices", "/v1/zonos/speech"})

    def __init__(self, app, settings: ServerSettings, limiter: _RateLimiter, metrics: _Metrics):
        self.app, self.settings, self.limiter, self.metrics = app, settings, limiter, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        limit = self.settings.max_upload_bytes if path in self.UPLOAD_PATHS else self.settings.max_body_bytes
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        try:
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > limit:
                raise ApiError(413, f"the body is {length} bytes; at most {limit} are allowed here", "too_large")
            if path != "/health":
                client = scope.get("client")
                _authorize(headers, client[0] if client else "?", self.settings, self.limiter)
        except ApiError as err:
            self.metrics.count(path, err.status)
            return await err.response()(scope, receive, send)
        received = 0

        async def capped():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(413, f"the body is over {limit} bytes, the most allowed here", "too_large")
            return message

        await self.app(scope, capped, send)


def _authorize(headers: dict[str, str], client: str, settings: ServerSettings, limiter: _RateLimiter) -> None:
    key = client
    if settings.api_key is not None:
        header = headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), settings.api_key.encode()):
            raise ApiError(401, "a valid API key is needed: send 'Authorization: Bearer <key>'", "invalid_api_key")
        key = token.strip()
    wait = limiter.take(key)
    if wait > 0:
        raise ApiError(
            429, f"too many requests: at most {settings.rate_limit:g} a minute; retry in {math.ceil(wait)} s",
            "rate_limited", headers={"Retry-After": str(math.ceil(wait))},
        )
