"""The error types of the public API.

Every bad input to a public entry point raises :class:`ZonosInputError` (a ``ValueError``, so existing
``except ValueError`` code keeps working) whose message names the input, the problem and the fix, before
any expensive work starts. Front ends (CLI, demo, server) show the message itself.
"""

from __future__ import annotations


class ZonosInputError(ValueError):
    """A bad argument, file or configuration; the message says which, what is wrong and what to do."""


class CheckpointError(ZonosInputError):
    """A checkpoint or config file that cannot be read or does not match its config (names the file)."""


class EngineFullError(RuntimeError):
    """The engine's queue is full: retry later (a server answers 503 with Retry-After)."""


class EngineClosedError(RuntimeError):
    """A request was submitted to an engine that has been shut down."""


__all__ = ["CheckpointError", "EngineClosedError", "EngineFullError", "ZonosInputError"]
