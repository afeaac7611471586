"""A speech request's answer: the engine's audio chunks, from a :class:`~zonos.serve.service.Job`, as a stream of
audio bytes, as server-sent events, or (``stream`` false) as one complete file.

A client that goes away cancels its request: a streamed answer's end cancels the job however it ends, and a
whole-file answer watches the connection while the audio is made.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from zonos.serve.encode import MEDIA_TYPES, OPUS_RATE, SAMPLE_RATE, StreamEncoder, encode_file
from zonos.serve.metrics import Metrics
from zonos.serve.schemas import SpeechSpec
from zonos.serve.service import END, Job, SpeechService

__all__ = ["JobResponse", "speak"]

DISCONNECT_POLL_S = 0.1  # how often a whole-file answer checks that its client is still there


async def speak(request: Request, spec: SpeechSpec, service: SpeechService, metrics: Metrics,
                instance: str) -> Response:  # fmt: skip
    """Check and prepare ``spec``, submit its first segment and answer with its audio (``instance`` names this
    server in the ``X-Zonos-Instance`` header)."""
    arrived = time.perf_counter()
    service.check(spec)
    plan = await asyncio.to_thread(service.prepare, spec)
    # The first (or only) segment is submitted before the answer begins, so a full engine gets its 503 here.
    submit = service.submit_segment if len(plan["segments"]) == 1 else service.submit_longform
    handle = await asyncio.to_thread(submit, spec, plan)
    job = Job(asyncio.get_running_loop())
    job.handle = handle
    feeder = threading.Thread(target=service.feed, args=(job, handle), name="zonos-serve-feed", daemon=True)
    feeder.start()
    rate = OPUS_RATE if spec.response_format == "opus" else SAMPLE_RATE
    headers = {"X-Zonos-Seed": str(plan["seed"]), "X-Sample-Rate": str(rate), "X-Zonos-Instance": instance,
               "Cache-Control": "no-store"}  # fmt: skip
    media_type = MEDIA_TYPES[spec.response_format]
    if not spec.stream:
        data = await _whole_file(request, job, spec, metrics, arrived)
        metrics.count(request.url.path, 200)
        return Response(data, media_type=media_type, headers=headers)
    metrics.count(request.url.path, 200)
    if spec.stream_format == "sse":
        return JobResponse(job, _sse(job, spec, metrics, arrived), media_type="text/event-stream", headers=headers)
    return JobResponse(job, _audio(job, spec, metrics, arrived), media_type=media_type, headers=headers)


class JobResponse(StreamingResponse):
    """A streamed speech response that cancels its request however it ends, also when the client went away
    before the body began (then the body's generator never runs, so its own cleanup would not either)."""

    def __init__(self, job: Job, content, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


async def _pieces(job: Job, metrics: Metrics, arrived: float) -> AsyncIterator[np.ndarray]:
    """The job's audio pieces; leaving early (a client gone) cancels the request."""
    with metrics.lock:
        metrics.streams += 1
    first = True
    try:
        while True:
            item = await job.queue.get()
            if item is END:
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


async def _audio(job: Job, spec: SpeechSpec, metrics: Metrics, arrived: float) -> AsyncIterator[bytes]:
    encoder = StreamEncoder(spec.response_format)
    async for piece in _pieces(job, metrics, arrived):
        data = encoder.encode(piece)
        if data:
            yield data
    tail = encoder.finish()
    if tail:
        yield tail


async def _sse(job: Job, spec: SpeechSpec, metrics: Metrics, arrived: float) -> AsyncIterator[str]:
    encoder = StreamEncoder(spec.response_format)
    samples = 0

    def event(payload: dict) -> str:
        return f"data: {json.dumps(payload)}\n\n"

    try:
        async for piece in _pieces(job, metrics, arrived):
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
                                                        "total_tokens": len(spec.text) + frames}})  # fmt: skip


async def _whole_file(request: Request, job: Job, spec: SpeechSpec, metrics: Metrics, arrived: float) -> bytes:
    """All of the job's audio as one file; an error while it is made propagates (the answer has not begun, so it
    gets its own status), and a client that leaves cancels the job."""

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        job.cancel()

    watcher = asyncio.create_task(watch())
    try:
        pieces = [piece async for piece in _pieces(job, metrics, arrived)]
    finally:
        watcher.cancel()
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    return await asyncio.to_thread(encode_file, spec.response_format, audio)
