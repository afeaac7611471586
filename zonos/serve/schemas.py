"""The speech routes' request bodies: how a body is read (:func:`json_body`), the two schemas, and the
:class:`SpeechSpec` each becomes."""

from __future__ import annotations

import base64
import email.message
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zonos.serve.errors import ApiError

__all__ = [
    "DEFAULT_VOICE",
    "OPENAI_VOICES",
    "VOICE_NAME",
    "SpeechRequest",
    "SpeechSpec",
    "ZonosSpeechRequest",
    "json_body",
    "openai_spec",
    "zonos_spec",
]

# OpenAI's built-in voice names; a client that sends one gets the default voice unless a stored voice has the name.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse")
DEFAULT_VOICE = "default"  # the model's learned unconditional speaker
VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Content types read as JSON besides application/json and */*+json: none (a bare HTTP client), text/plain, and the
# form type that `curl -d` sends when no Content-Type is given. Their bodies must still parse as JSON.
LENIENT_TYPES = frozenset({"", "text/plain", "application/x-www-form-urlencoded"})

STREAM_HELP = (
    "true (default): audio goes out as it is generated, and a wav/flac header's lengths say 'unknown'; false: "
    "one complete file once all audio is made, its header's lengths exact and Content-Length set"
)


class SpeechRequest(BaseModel):
    """OpenAI's ``/v1/audio/speech`` body (unknown fields, e.g. ``instructions``, are ignored)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    input: str
    voice: str = DEFAULT_VOICE
    response_format: str = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    stream: bool = Field(True, description=STREAM_HELP)


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
    vqscore_8: list[float] | None = Field(
        None, description="8 targets; conditioned on only when unconditional_keys leaves it out (by default it is in)"
    )
    ctc_loss: float = 0.0
    dnsmos_ovrl: float = Field(
        4.0, description="conditioned on only when unconditional_keys leaves it out (by default it is in)"
    )
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
    stream: bool = Field(True, description=STREAM_HELP)


@dataclass
class SpeechSpec:
    """A speech request as the service runs it: the text, the voice, the answer's form, the conditioning values
    (``make_cond_dict``'s keyword arguments) and the generation settings."""

    text: str
    voice: str
    response_format: str
    stream_format: str
    cond: dict
    stream: bool = True
    seed: int | None = None
    cfg_scale: float = 2.0
    sampling: dict | None = None
    max_new_tokens: int | None = None
    first_chunk_frames: int | None = None
    chunk_frames: int | None = None
    speaker_audio: bytes | None = None
    prefix_audio: bytes | None = None


Body = TypeVar("Body", bound=BaseModel)


def json_body(schema: type[Body]) -> Callable[[Request], Awaitable[Body]]:
    """A FastAPI dependency that reads the request's body as ``schema``: UTF-8 JSON, under Content-Type
    application/json, or none, text/plain or the form type a bare ``curl -d`` sends. Another content type is a
    415, bytes that are not UTF-8 or not JSON a 400, each saying what to send instead."""

    async def parse(request: Request) -> Body:
        header = request.headers.get("content-type", "")
        parsed = email.message.Message()
        parsed["content-type"] = header
        media = parsed.get_content_type().lower() if header else ""
        if not (media == "application/json" or media.endswith("+json") or media in LENIENT_TYPES):
            raise ApiError(
                415, f"Content-Type {header!r} is not JSON: send the request as a JSON object with "
                "Content-Type: application/json", "unsupported_media_type",
            )  # fmt: skip
        data = await request.body()
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ApiError(
                400, f"the body is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}): send the JSON "
                "encoded as UTF-8", "bad_encoding",
            ) from None  # fmt: skip
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            what = "empty" if not text.strip() else f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
            raise ApiError(
                400, f"the body is {what}: send a JSON object (Content-Type: application/json)", "bad_json"
            ) from None
        try:
            return schema.model_validate(value)
        except ValidationError as e:  # answered by the handler of FastAPI's own body errors
            raise RequestValidationError(e.errors()) from None

    return parse


def openai_spec(body: SpeechRequest) -> SpeechSpec:
    """The spec of an OpenAI request: ``speed`` scales Zonos' speaking rate (15 at speed 1, capped at 40)."""
    return SpeechSpec(
        text=body.input, voice=body.voice, response_format=body.response_format, stream_format=body.stream_format,
        stream=body.stream, cond=dict(speaking_rate=min(15.0 * body.speed, 40.0)),
    )  # fmt: skip


def zonos_spec(body: ZonosSpeechRequest) -> SpeechSpec:
    """The spec of a native request; bad sampling settings and base64 are refused here, before any work."""
    cond: dict[str, Any] = dict(
        language=body.language, fmax=body.fmax, pitch_std=body.pitch_std, speaking_rate=body.speaking_rate,
        ctc_loss=body.ctc_loss, dnsmos_ovrl=body.dnsmos_ovrl, speaker_noised=body.speaker_noised,
    )  # fmt: skip
    for key in ("emotion", "vqscore_8"):
        if getattr(body, key) is not None:
            cond[key] = getattr(body, key)
    if body.unconditional_keys is not None:
        cond["unconditional_keys"] = set(body.unconditional_keys)
    if body.sampling is not None:
        from zonos.sampling import SamplingParams

        SamplingParams.from_dict(body.sampling)
    return SpeechSpec(
        text=body.input, voice=body.voice, response_format=body.response_format, stream_format=body.stream_format,
        stream=body.stream, cond=cond, seed=body.seed, cfg_scale=body.cfg_scale, sampling=body.sampling,
        max_new_tokens=body.max_new_tokens, first_chunk_frames=body.first_chunk_frames,
        chunk_frames=body.chunk_frames,
        speaker_audio=decode_base64(body.speaker_audio, "speaker_audio") if body.speaker_audio else None,
        prefix_audio=decode_base64(body.prefix_audio, "prefix_audio") if body.prefix_audio else None,
    )  # fmt: skip


def decode_base64(value: str, param: str) -> bytes:
    """``value``'s bytes; :class:`ApiError` 400 naming ``param`` when it is not base64."""
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ApiError(400, f"{param}: not valid base64", "bad_base64", param) from None
