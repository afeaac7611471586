"""What the speech server allows and how it runs the engine: :class:`ServerSettings`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from zonos.errors import ZonosInputError

__all__ = ["ServerSettings"]


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
        warmup: on CUDA, compile kernels and capture graphs (every prompt length, every bucket of busy slots) before
            taking requests.
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
