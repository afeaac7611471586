"""Audio helpers: band-limited resampling in plain torch, and file I/O through soundfile.

:func:`resample` computes what ``torchaudio.functional.resample`` computes with its defaults
(Hann-windowed sinc interpolation, ``lowpass_filter_width=6``, ``rolloff=0.99``), so torchaudio is
not a dependency.  Both rates are divided by their gcd, and the filter is applied as a polyphase
bank: one kernel per output phase, strided over the input.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["resample", "load_audio", "save_audio"]


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
        raise ValueError(f"sample rates must be positive integers, got {orig_sr} and {new_sr}")
    if not torch.is_floating_point(wav):
        raise TypeError(f"resample needs a floating-point waveform, got {wav.dtype}")
    if orig_sr == new_sr:
        return wav
    gcd = math.gcd(int(orig_sr), int(new_sr))
    orig, new = int(orig_sr) // gcd, int(new_sr) // gcd
    kernel, width = _sinc_bank(orig, new, lowpass_filter_width, rolloff)
    kernel = kernel.to(device=wav.device, dtype=wav.dtype)

    shape = wav.shape
    length = shape[-1]
    flat = wav.reshape(-1, 1, length)
    # Zero-pad so every block k = 0 .. ceil(N / orig) has its full set of taps.
    flat = F.pad(flat, (width, width + orig))
    out = F.conv1d(flat, kernel, stride=orig)  # [M, new, blocks]: phase p of block k
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)  # interleave phases in time order
    target = math.ceil(new * length / orig)
    return out[:, :target].reshape(*shape[:-1], target)


def load_audio(path: str | Path) -> tuple[Tensor, int]:
    """Read an audio file as ``(wav [channels, samples] float32, sample_rate)``."""
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"audio file not found: {path}")
    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as e:  # libsndfile raises several types for corrupt/unsupported files
        raise ValueError(
            f"could not read audio file {path} ({e}). Formats readable by libsndfile include WAV, "
            "FLAC, OGG/Vorbis and (libsndfile >= 1.1) MP3; convert the file first, e.g. with ffmpeg."
        ) from e
    return torch.from_numpy(np.ascontiguousarray(data.T)), int(sr)


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
