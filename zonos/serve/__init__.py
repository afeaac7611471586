"""The speech server: an OpenAI-compatible streaming HTTP API on the engine (:mod:`zonos.serve.app`), and a Ray
Serve deployment of it (:mod:`zonos.serve.ray_app`). Needs the ``server`` extra (FastAPI, uvicorn)."""

from zonos.serve.app import create_app
from zonos.serve.errors import ApiError
from zonos.serve.settings import ServerSettings

__all__ = ["ApiError", "ServerSettings", "create_app"]
