"""Audio helpers: band-limited resampling in plain torch, input checks for waveforms, file I/O through
soundfile, WAV headers for streams, and files written atomically.

:func:`resample` computes what ``torchaudio.functional.resample`` computes with its defaults
(Hann-windowed sinc interpolation, ``lowpass_filter_width=6``, ``rolloff=0.99``), so torchaudio is
not a dependency.  Both rates are divided by their gcd, and the filter is applied as a polyphase
bank: one kernel per output phase, strided over the input.  For rates whose gcd is small (44101 Hz to
16 kHz), that bank would hold ``new x (orig + taps)`` mostly-zero weights (15 GB for 44101 -> 44100 Hz), so
such rates gather only the non-zero taps of each output sample instead, in bounded blocks.
"""

from __future__ import annotations

import math
import numbers
import os
import struct
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from zonos.errors import ZonosInputError

__all__ = [
    "INT16_LIKE_PEAK",
    "MAX_PREFIX_SECONDS",
    "MAX_SAMPLE_RATE",
    "MIN_SAMPLE_RATE",
    "atomic_path",
    "check_sample_rate",
    "check_waveform",
    "load_audio",
    "resample",
    "save_audio",
    "wav_header",
]

MIN_SAMPLE_RATE = 8_000  # telephone quality; lower rates (or a header claiming 1 Hz) carry no usable speech
MAX_SAMPLE_RATE = 768_000  # the highest rate audio interfaces record at
# A float waveform peaking above this was scaled like int16 PCM (x 32767), not [-1, 1]: an int16 recording
# peaking below 32 (-60 dBFS) is near silence, while float audio rarely exceeds 1 by more than a little.
INT16_LIKE_PEAK = 32.0
# A clip to continue (audio_prefix_codes) is read up to here: its codes share max_seqlen with the generated frames.
MAX_PREFIX_SECONDS = 30.0
# Above this many polyphase weights (8 MB in float64) resample gathers taps instead of building the bank.
_MAX_BANK = 1 << 20
_GATHER_BLOCK = 1 << 16  # output samples per gathered block (with ~15-300 taps each)


def check_sample_rate(sr: object, name: str = "sample rate") -> int:
    """``sr`` as an int in ``[MIN_SAMPLE_RATE, MAX_SAMPLE_RATE]``; refuses bools (``preprocess(wav, True)``
    would be 1 Hz), strings and fractional rates with :class:`~zonos.errors.ZonosInputError`."""
    if isinstance(sr, Tensor) and sr.dim() == 0:
        sr = sr.item()
    if isinstance(sr, bool) or not isinstance(sr, numbers.Real) or not math.isfinite(sr) or sr != int(sr):
        raise ZonosInputError(f"{name} must be a whole number of Hz such as 44100, got {sr!r} ({type(sr).__name__})")
    sr = int(sr)
    if not MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE:
        raise ZonosInputError(
            f"{name} {sr} Hz is outside {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz; check the file's header, or "
            "resample the recording (e.g. ffmpeg -ar 44100)"
        )
    return sr


def check_waveform(wav: object, name: str = "wav") -> Tensor:
    """A finite floating-point waveform tensor (numpy arrays are converted); warns and rescales one whose peak
    exceeds :data:`INT16_LIKE_PEAK`, i.e. float samples scaled like int16 PCM, dividing by 32768 (or by the
    peak if larger) so it lies in [-1, 1]. Raises :class:`~zonos.errors.ZonosInputError` otherwise."""
    if isinstance(wav, np.ndarray):
        if wav.dtype.kind not in "fiu":
            raise ZonosInputError(f"{name} must hold real samples, got a numpy array of {wav.dtype}")
        wav = torch.from_numpy(np.ascontiguousarray(wav))
    if not isinstance(wav, Tensor):
        raise ZonosInputError(f"{name} must be a torch.Tensor or numpy array, got {type(wav).__name__}")
    if not torch.is_floating_point(wav):
        raise ZonosInputError(
            f"{name} must be floating point with samples in [-1, 1], got {wav.dtype}; "
            "e.g. convert int16 PCM with wav.float() / 32768"
        )
    if wav.numel() == 0:
        raise ZonosInputError(f"{name} is empty (shape {tuple(wav.shape)}); pass a recording")
    if not bool(wav.isfinite().all()):
        raise ZonosInputError(f"{name} contains NaN or infinite samples; check how the audio was read or computed")
    peak = float(wav.abs().max())
    if peak > INT16_LIKE_PEAK:
        scale = 32768.0 if peak <= 32768.0 else peak
        warnings.warn(
            f"{name} peaks at {peak:.4g}, far outside [-1, 1]: it looks scaled like int16 PCM; dividing it by "
            f"{scale:.6g}. Pass float samples in [-1, 1] (e.g. int16 / 32768) to silence this warning",
            UserWarning,
            stacklevel=3,
        )
        wav = wav / scale
    return wav


def _sinc_bank(orig: int, new: int, lowpass_filter_width: int, rolloff: float) -> tuple[Tensor, int]:
    """Polyphase filters ``[new, 1, 2 * width + orig]`` (float64) for gcd-reduced rates, and ``width``.

    Output sample ``j = k * new + p`` sits at input position ``k * orig + p * orig / new``; filter
    ``p`` holds the windowed-sinc weights of the input samples ``k * orig - width`` up to
    ``k * orig + width + orig - 1`` around it.
    """
    cutoff = min(orig, new) * rolloff  # in cycles per gcd-reduced block, below both Nyquists
    width = math.ceil(lowpass_filter_width * orig / cutoff)  # half-length of the taps, in input samples
    taps = torch.arange(-width, width + orig, dtype=torch.float64) / orig  # input times (blocks)
    phases = torch.arange(new, dtype=torch.float64)[:, None] / new  # output times (blocks)
    # Distance in units of the cutoff period; the window reaches zero at +-lowpass_filter_width.
    x = ((taps[None, :] - phases) * cutoff).clamp(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(x * (math.pi / (2 * lowpass_filter_width))) ** 2
    sinc = torch.where(x == 0, torch.ones_like(x), torch.sin(math.pi * x) / (math.pi * x))
    # cutoff / orig makes the DC gain 1 (the sinc's integral over input samples).
    return (sinc * window * (cutoff / orig)).unsqueeze(1), width


def resample(
    wav: Tensor,
    orig_sr: int,
    new_sr: int,
    lowpass_filter_width: int = 6,
    rolloff: float = 0.99,
) -> Tensor:
    """Resample along the last axis from ``orig_sr`` to ``new_sr`` Hz.

    Any leading shape is kept; the output length is ``ceil(N * new_sr / orig_sr)``, like torchaudio.
    Equal rates return the input unchanged.  Works on any device and floating dtype.
    """
    if orig_sr <= 0 or new_sr <= 0 or int(orig_sr) != orig_sr or int(new_sr) != new_sr:
        raise ZonosInputError(f"sample rates must be positive integers, got {orig_sr} and {new_sr}")
    if not torch.is_floating_point(wav):
        raise ZonosInputError(f"resample needs a floating-point waveform, got {wav.dtype}")
    if orig_sr == new_sr:
        return wav
    gcd = math.gcd(int(orig_sr), int(new_sr))
    orig, new = int(orig_sr) // gcd, int(new_sr) // gcd
    shape = wav.shape
    length = shape[-1]
    flat = wav.reshape(-1, length)
    target = math.ceil(new * length / orig)
    width = _half_width(orig, new, lowpass_filter_width, rolloff)
    if new * (2 * width + orig) > _MAX_BANK:
        out = _resample_gather(flat, orig, new, target, lowpass_filter_width, rolloff)
        return out.reshape(*shape[:-1], target)
    kernel, width = _sinc_bank(orig, new, lowpass_filter_width, rolloff)
    kernel = kernel.to(device=wav.device, dtype=wav.dtype)
    # Zero-pad so every block k = 0 .. ceil(N / orig) has its full set of taps.
    padded = F.pad(flat[:, None], (width, width + orig))
    out = F.conv1d(padded, kernel, stride=orig)  # [M, new, blocks]: phase p of block k
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)  # interleave phases in time order
    return out[:, :target].reshape(*shape[:-1], target)


def _half_width(orig: int, new: int, lowpass_filter_width: int, rolloff: float) -> int:
    """Half-length of the filter in input samples (as :func:`_sinc_bank` computes it)."""
    return math.ceil(lowpass_filter_width * orig / (min(orig, new) * rolloff))


def _resample_gather(
    flat: Tensor, orig: int, new: int, target: int, lowpass_filter_width: int, rolloff: float
) -> Tensor:
    """The polyphase resampling of ``flat [M, N]`` computed from each output sample's non-zero taps only.

    Output ``j = k * new + p`` sits at input position ``k * orig + p * orig / new``; its window reaches
    ``width`` input samples either side, so the taps at ``k * orig + floor(p * orig / new) + r`` for
    ``r = -width .. width + 1`` carry all of :func:`_sinc_bank`'s weight (the bank's other taps lie where the
    window is zero, up to float64 rounding).  Memory is ``new x taps`` weights plus one block of gathers.
    """
    cutoff = min(orig, new) * rolloff
    width = _half_width(orig, new, lowpass_filter_width, rolloff)
    phases = torch.arange(new, dtype=torch.float64)
    base = torch.div(torch.arange(new, dtype=torch.int64) * orig, new, rounding_mode="floor")  # [new]
    offsets = torch.arange(-width, width + 2, dtype=torch.int64)  # [taps]
    taps = (base[:, None] + offsets[None, :]).double() / orig  # input times (blocks) of each phase's taps
    x = ((taps - phases[:, None] / new) * cutoff).clamp(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(x * (math.pi / (2 * lowpass_filter_width))) ** 2
    sinc = torch.where(x == 0, torch.ones_like(x), torch.sin(math.pi * x) / (math.pi * x))
    weights = (sinc * window * (cutoff / orig)).to(device=flat.device, dtype=flat.dtype)  # [new, taps]
    base, offsets = base.to(flat.device), offsets.to(flat.device)
    length = flat.shape[-1]
    padded = F.pad(flat, (width, width + orig + 2))  # index i of the signal is padded[i + width]
    out = flat.new_empty(flat.shape[0], target)
    for start in range(0, target, _GATHER_BLOCK):
        j = torch.arange(start, min(start + _GATHER_BLOCK, target), device=flat.device)
        p = j % new
        first = torch.div(j, new, rounding_mode="floor") * orig + base[p] + width  # padded index of r = 0
        idx = (first[:, None] + offsets[None, :]).clamp(0, length + 2 * width + orig + 1)
        out[:, start : start + j.numel()] = (padded[:, idx] * weights[p]).sum(-1)
    return out


def load_audio(
    source: str | Path | BinaryIO, max_seconds: float | None = None, name: str = "the audio"
) -> tuple[Tensor, int]:
    """Read an audio file (a path, or a binary file object such as ``io.BytesIO`` of an upload) as
    ``(wav [channels, samples] float32, sample_rate)``.

    The header's sample rate is checked first (:func:`check_sample_rate`), so a file claiming 1 Hz costs nothing.
    With ``max_seconds`` only the first ``max_seconds`` are decoded: a small compressed file can hold hours (a
    355 KB FLAC of 4 h of a constant decodes to 1.2 GB), so readers of uploads bound what they decode.
    Raises FileNotFoundError for a missing path and :class:`~zonos.errors.ZonosInputError` for an unreadable file
    or a rate out of range; ``name`` stands for a file object in the messages.
    """
    import soundfile as sf

    if max_seconds is not None and (
        isinstance(max_seconds, bool) or not isinstance(max_seconds, numbers.Real) or not 0 < max_seconds < 1e6
    ):
        raise ZonosInputError(f"max_seconds must be a positive number of seconds (or None), got {max_seconds!r}")
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"audio file not found: {path}")
        source, name = str(path), str(path)
    try:
        f = sf.SoundFile(source)
    except Exception as e:  # libsndfile raises several types for corrupt/unsupported files
        raise ZonosInputError(
            f"could not read {name} as audio ({e}). Formats readable by libsndfile include WAV, "
            "FLAC, OGG/Vorbis and (libsndfile >= 1.1) MP3; convert the file first, e.g. with ffmpeg."
        ) from e
    with f:
        sr = check_sample_rate(f.samplerate, f"{name}: sample rate")
        frames = -1 if max_seconds is None else max(1, int(max_seconds * sr))
        try:
            data = f.read(frames, dtype="float32", always_2d=True)
        except Exception as e:  # a file truncated after its header
            raise ZonosInputError(f"could not decode {name} ({e}); export or download it again") from e
    return torch.from_numpy(np.ascontiguousarray(data.T)), sr


def save_audio(path: str | Path, wav: Tensor, sr: int, subtype: str | None = None) -> None:
    """Write ``wav`` (``[samples]``, ``[channels, samples]`` or ``[1, channels, samples]``) to ``path``.

    The format follows the file extension; ``subtype`` (e.g. ``"PCM_16"``, ``"FLOAT"``) defaults to
    soundfile's choice for it.  Integer formats get the signal clipped to ``[-1, 1]`` first.
    """
    import soundfile as sf

    wav = wav.detach()
    if wav.dim() == 3:
        if wav.shape[0] != 1:
            raise ValueError(f"save_audio writes one clip; got a batch of {wav.shape[0]}")
        wav = wav[0]
    if wav.dim() == 1:
        wav = wav[None]
    if wav.dim() != 2:
        raise ValueError(f"expected [samples] or [channels, samples], got shape {tuple(wav.shape)}")
    data = wav.to("cpu", torch.float32).numpy().T
    extension = Path(path).suffix.lstrip(".").upper()
    try:
        chosen = subtype or sf.default_subtype(extension)
    except ValueError as e:
        raise ValueError(f"cannot tell the audio format of {path}; use a .wav, .flac or .ogg name") from e
    if not chosen.upper().startswith(("FLOAT", "DOUBLE")):
        # libsndfile does not clip by default, so out-of-range samples could overflow integer PCM.
        data = np.clip(data, -1.0, 1.0)
    sf.write(str(path), data, int(sr), subtype=subtype)


def _temp_beside(path: Path) -> Path:
    """A new empty file in ``path``'s directory (so the final rename stays on one file system)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the result private
    return Path(tmp)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` that replaces it when the block succeeds and is removed otherwise, so a
    failed or interrupted write never leaves a partial file (output audio, voice files)."""
    tmp = _temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def wav_header(sample_rate: int, subtype: str, frames: int | None = None) -> bytes:
    """A mono RIFF/WAVE header for PCM_16 or FLOAT samples; ``frames=None`` marks the length unknown (a stream)."""
    tag, width = (1, 2) if subtype == "PCM_16" else (3, 4)
    data = 0xFFFFFFFF if frames is None else frames * width
    riff = 0xFFFFFFFF if frames is None else 36 + data
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        *(b"RIFF", riff, b"WAVE", b"fmt ", 16, tag, 1, sample_rate, sample_rate * width, width, 8 * width),
        *(b"data", data),
    )
