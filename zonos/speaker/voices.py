"""Voice files: a speaker embedding saved by ``zonos-tts voice`` (or the server's ``POST /v1/audio/voices``) for
later requests, as a ``torch.save`` dict carrying the :data:`VOICE_FORMAT` marker so other ``.pt`` files are told
apart."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from zonos.errors import ZonosInputError

__all__ = ["VOICE_FORMAT", "VOICE_VERSION", "VoiceFileError", "load_voice", "save_voice"]

VOICE_FORMAT = "zonos-voice"
VOICE_VERSION = 1
# Leading bytes of audio files that someone might pass as a voice file by mistake.
_AUDIO_MAGIC = (b"RIFF", b"fLaC", b"OggS", b"ID3", b"\xff\xfb", b"\xff\xf3", b"FORM")


class VoiceFileError(ZonosInputError):
    """A voice file that cannot be used: the message names it, says what it is instead and how to make one."""


def load_voice(path: str | os.PathLike, name: str | None = None):
    """The (1, 1, 128) speaker embedding in a voice file from ``zonos-tts voice`` (or in a plain tensor of 128
    values saved with ``torch.save``). Raises :class:`VoiceFileError` saying what the file is instead; its message
    starts with ``name`` (e.g. the flag that gave the path) and the path."""
    import torch

    where = f"{name} {path}" if name else str(path)
    p = Path(path).expanduser()
    if not p.is_file():
        raise VoiceFileError(f"{where}: no such file")
    with p.open("rb") as f:
        head = f.read(4)
    if head.startswith(_AUDIO_MAGIC):
        raise VoiceFileError(
            f"{where}: is an audio clip, not a voice file; pass it as --speaker-audio, or make a voice file "
            f"with `zonos-tts voice {path}`"
        )
    try:
        data = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception:  # unpickling and zip errors come as several types, with long messages
        raise VoiceFileError(f"{where}: torch.load cannot read it; not a voice file from `zonos-tts voice`") from None
    if isinstance(data, dict):
        if data.get("format") != VOICE_FORMAT:
            raise VoiceFileError(f"{where}: a dict without the {VOICE_FORMAT!r} marker; make it with `zonos-tts voice`")
        if data.get("version", 0) > VOICE_VERSION:
            raise VoiceFileError(f"{where}: voice file version {data['version']} is newer than this zonos-tts")
        data = data.get("embedding")
    if not isinstance(data, torch.Tensor) or data.numel() != 128 or not data.is_floating_point():
        raise VoiceFileError(f"{where}: holds no 128-value speaker embedding; make it with `zonos-tts voice`")
    if not bool(torch.isfinite(data.float()).all()):
        raise VoiceFileError(f"{where}: the embedding has NaN or infinite values; make it again")
    return data.reshape(1, 1, 128)


def save_voice(path: str | os.PathLike, embedding, **info: Any) -> None:
    """Write ``embedding`` (128 values) as a voice file, with ``info`` (e.g. the clip's name) beside it, atomically:
    the file appears complete or not at all."""
    import torch

    from zonos.audio import atomic_path

    record = {"format": VOICE_FORMAT, "version": VOICE_VERSION, "embedding": embedding.detach().cpu(), **info}
    with atomic_path(Path(path)) as tmp:
        torch.save(record, str(tmp))
