"""Where ``speak`` writes its audio: a file (wav, flac or ogg, through a temporary file renamed into place at the
end) or a WAV stream on standard output; a failed write becomes one :class:`~zonos.cli.common.OutputError` line."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from zonos.cli.common import OutputError, UsageError, check_writable

CONTAINERS = {".wav": "WAV", ".flac": "FLAC", ".ogg": "OGG"}


@dataclass
class Output:
    """Where audio goes: a file path (container, subtype) or stdout ("-", always wav)."""

    path: Path | None
    container: str
    subtype: str


def check_output(out: str, sample_format: str | None) -> Output:
    """``--out`` and ``--sample-format`` as an :class:`Output`; raises :class:`UsageError`."""
    if out == "-":
        if sys.stdout is None:
            raise UsageError("--out -: there is no standard output (it is closed); give a file, or redirect it")
        if sys.stdout.isatty():
            raise UsageError(
                "--out -: standard output is a terminal; redirect it (> file.wav, | player) or give a file"
            )
        return Output(None, "WAV", "FLOAT" if sample_format == "float" else "PCM_16")
    path = Path(out).expanduser()
    check_writable(path, "--out")
    container = CONTAINERS.get(path.suffix.lower())
    if container is None:
        raise UsageError(f"--out {out}: unknown audio format {path.suffix or '(none)'!r}; name it .wav, .flac or .ogg")
    if container == "FLAC" and sample_format == "float":
        raise UsageError(f"--out {out}: FLAC stores integer samples; use --sample-format pcm16, or a .wav name")
    if container == "OGG" and sample_format is not None:
        raise UsageError(f"--out {out}: .ogg is Vorbis, which has no sample format; drop --sample-format")
    subtype = {"OGG": "VORBIS"}.get(container, "FLOAT" if sample_format == "float" else "PCM_16")
    return Output(path, container, subtype)


def _wav_data(audio, subtype: str) -> bytes:
    """float32 samples as the bytes of a little-endian WAV data chunk of ``subtype``, converted by libsndfile
    (headerless RAW into memory), so stdout holds exactly the samples a file of that subtype would."""
    import soundfile as sf

    buffer = io.BytesIO()
    with sf.SoundFile(buffer, "w", 44100, 1, subtype, endian="LITTLE", format="RAW") as f:
        f.write(audio)
    return buffer.getvalue()


class _Writer:
    """Appends float32 mono audio to an open output and counts the samples written."""

    def __init__(self, put: Callable[[Any], None]):
        self._put, self.samples = put, 0

    def write(self, audio) -> None:
        import numpy as np

        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        self._put(audio)
        self.samples += audio.size


@contextmanager
def audio_sink(out: Output, sample_rate: int, stdout: BinaryIO | None, frames: int | None = None) -> Iterator[_Writer]:
    """A writer to ``out``: a WAV stream on ``stdout``, or a temp file that replaces ``out.path`` at the end of
    the block (removed instead when the block fails). Every write is flushed, so readers see the audio so far."""
    if out.path is None:
        from zonos.audio import wav_header

        with _writing("standard output"):
            stdout.write(wav_header(sample_rate, out.subtype, frames))

        def put(audio) -> None:
            with _writing("standard output"):
                stdout.write(_wav_data(audio, out.subtype))
                stdout.flush()

        yield _Writer(put)
        with _writing("standard output"):
            stdout.flush()
        return
    import numpy as np
    import soundfile as sf

    from zonos.audio import atomic_path

    where = str(out.path)
    with atomic_path(out.path) as tmp:
        with _writing(where):
            f = sf.SoundFile(str(tmp), "w", sample_rate, 1, out.subtype, format=out.container)

        def put(audio) -> None:
            if out.subtype != "FLOAT":
                audio = np.clip(audio, -1.0, 1.0)  # libsndfile does not clip: out-of-range samples would wrap
            with _writing(where):
                f.write(audio)
                f.flush()

        try:
            yield _Writer(put)
        except BaseException:
            f.close()
            raise
        with _writing(where):  # the header's lengths are written at close
            f.close()


@contextmanager
def _writing(where: str) -> Iterator[None]:
    """Turn a failed write to ``where`` into an :class:`OutputError` naming the problem and the fix."""
    import errno

    import soundfile as sf

    try:
        yield
    except BrokenPipeError:
        raise OutputError(
            f"{where} was closed by its reader before the audio ended (e.g. `| head`); the audio is incomplete: "
            "keep the reader open to the end, or write to a file"
        ) from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            problem = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is used up"}
            raise OutputError(
                f"cannot write {where}: {problem.get(e.errno, 'the file is too large for its file system')}; free "
                "some space, or write the audio elsewhere (--out)"
            ) from None
        raise OutputError(
            f"cannot write {where}: {e.strerror or e}; check the device, or write elsewhere (--out)"
        ) from None
    except sf.SoundFileRuntimeError as e:  # libsndfile reports a failed write (a full disk) as a "System error"
        raise OutputError(
            f"cannot write {where}: {e}; check that its disk has free space, or write elsewhere (--out)"
        ) from None
