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

Both speech routes take a JSON body (Content-Type application/json; a body sent as text/plain, as a bare
``curl -d``'s form type or with no type is read as JSON too) and ``stream``: true (the default) streams the audio,
its header's lengths "unknown" (see :mod:`zonos.serve.encode`); false answers one complete file once the audio is
made, with exact lengths and a Content-Length.

Safe defaults (:class:`~zonos.serve.settings.ServerSettings`): the CLI binds 127.0.0.1; an optional bearer API key;
text up to 4096 characters; body and upload limits; a per-key request rate. Every error is answered with an
OpenAI-style JSON error (``{"error": {"message", "type", "param", "code"}}``, :mod:`zonos.serve.errors`): bad input
4xx, a full engine queue 503 with ``Retry-After``; a client that goes away cancels its request (its slot is free at
the engine's next step).

A request seeded with ``seed`` gives the same samples as ``model.generate(..., stream=True)`` with
``torch.Generator().manual_seed(seed)`` and the same chunk schedule, whatever else the server runs.

The parts: :mod:`~zonos.serve.schemas` (request bodies), :mod:`~zonos.serve.service` (the engine bridge),
:mod:`~zonos.serve.responses` (streams and files), :mod:`~zonos.serve.limits` (key, rate and body limits),
:mod:`~zonos.serve.metrics`, :mod:`~zonos.serve.errors` and :mod:`~zonos.serve.encode` (audio formats).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from zonos.serve.errors import ApiError, install_error_handlers
from zonos.serve.limits import LimitsMiddleware, RateLimiter
from zonos.serve.metrics import Metrics
from zonos.serve.responses import speak
from zonos.serve.schemas import OPENAI_VOICES, SpeechRequest, ZonosSpeechRequest, json_body, openai_spec, zonos_spec
from zonos.serve.service import SpeechService
from zonos.serve.settings import ServerSettings

__all__ = ["create_app"]


def create_app(load_model: Callable[[], Any], settings: ServerSettings | None = None) -> FastAPI:
    """The speech server's FastAPI app. ``load_model()`` returns a loaded :class:`zonos.model.Zonos`; it runs (on
    a worker thread) when the app starts, then the engine is created from ``settings`` and, on CUDA, warmed up.
    ``/health`` answers 503 until then."""
    settings = settings or ServerSettings()
    instance = secrets.token_hex(4)  # names this server (a replica) in responses' X-Zonos-Instance
    metrics = Metrics()
    limiter = RateLimiter(settings.rate_limit)
    state: dict[str, SpeechService | None] = {"service": None}

    def start() -> SpeechService:
        model = load_model()
        if settings.slots is not None:
            model.start_engine(
                slots=settings.slots,
                max_seqlen=settings.max_seqlen,
                queue_size=settings.queue_size,
                vocoder_batching=settings.vocoder_batching,
            )
        if settings.warmup and model.device.type == "cuda":
            # Every bucket of busy slots, so no step graph or slab push is compiled while requests wait on it.
            model.warmup(
                progress_bar=False,
                all_prefill_lengths=True,
                streams=model.engine.slots.count,
                logits_processor=settings.logits_processor,
            )
        return SpeechService(model, settings)

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

    def service() -> SpeechService:
        s = state["service"]
        if s is None:
            raise ApiError(503, "the model is still loading; retry shortly", "loading",
                           headers={"Retry-After": str(settings.retry_after_s)})  # fmt: skip
        return s

    install_error_handlers(app, settings, metrics)
    app.add_middleware(LimitsMiddleware, settings=settings, limiter=limiter, metrics=metrics)

    @app.get("/health")
    async def health():
        s = state["service"]
        if s is None:
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "5"})
        engine = s.engine
        return {"status": "ok", "model": settings.model_name, "slots": engine.slots.count, "active": engine.active,
                "queued": engine.queued, "formats": s.formats}  # fmt: skip

    @app.get("/metrics")
    async def prometheus():
        s = state["service"]
        return PlainTextResponse(metrics.render(s.engine if s else None), media_type="text/plain; version=0.0.4")

    @app.get("/v1/audio/voices")
    async def list_voices():
        s = service()
        return {"object": "list", "data": [{"name": n, "object": "voice"} for n in s.voice_names()],
                "aliases": {"default": list(OPENAI_VOICES)}}  # fmt: skip

    @app.post("/v1/audio/voices")
    async def add_voice(name: Annotated[str, Form()], file: Annotated[UploadFile, File()]):
        s = service()
        data = await file.read()
        result = await asyncio.to_thread(s.store_voice, name, data, file.filename)
        metrics.count("/v1/audio/voices", 200)
        return result

    @app.post("/v1/audio/speech")
    async def speech(body: Annotated[SpeechRequest, Depends(json_body(SpeechRequest))], request: Request) -> Response:
        return await speak(request, openai_spec(body), service(), metrics, instance)

    @app.post("/v1/zonos/speech")
    async def zonos_speech(
        body: Annotated[ZonosSpeechRequest, Depends(json_body(ZonosSpeechRequest))], request: Request
    ) -> Response:
        return await speak(request, zonos_spec(body), service(), metrics, instance)

    return app
