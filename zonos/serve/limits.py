"""What every request passes before a route runs (:class:`LimitsMiddleware`): the body limit, the API key and
the request rate."""

from __future__ import annotations

import hmac
import math
import threading
import time

from zonos.serve.errors import ApiError
from zonos.serve.metrics import Metrics
from zonos.serve.settings import ServerSettings

__all__ = ["LimitsMiddleware", "RateLimiter", "authorize"]


class RateLimiter:
    """A token bucket per key: ``per_minute`` requests a minute, bursts up to the same number."""

    def __init__(self, per_minute: float | None) -> None:
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


class LimitsMiddleware:
    """ASGI middleware: the body limit (a declared length at once, a chunked body as it arrives), the API key and
    the request rate, before any route runs."""

    UPLOAD_PATHS = frozenset({"/v1/audio/voices", "/v1/zonos/speech"})

    def __init__(self, app, settings: ServerSettings, limiter: RateLimiter, metrics: Metrics) -> None:
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
                authorize(headers, client[0] if client else "?", self.settings, self.limiter)
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


def authorize(headers: dict[str, str], client: str, settings: ServerSettings, limiter: RateLimiter) -> None:
    """Raise :class:`ApiError` 401 without the API key (when one is set), 429 past the key's (or, without a key,
    the client address's) request rate."""
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
            429,
            f"too many requests: at most {settings.rate_limit:g} a minute; retry in {math.ceil(wait)} s",
            "rate_limited",
            headers={"Retry-After": str(math.ceil(wait))},
        )
