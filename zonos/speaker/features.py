"""The speaker network's input: mean-normalised log-mel filterbank features at 16 kHz, in plain torch.

This computes what the upstream model gets from ``torchaudio.transforms.MelSpectrogram`` with
``n_fft=512, win_length=400, hop_length=160, n_mels=80`` (other arguments at their defaults: periodic
Hann window, ``center=True`` with reflect padding, power 2, HTK mel scale, no filter normalisation),
followed by ``ln(x + 1e-6)`` and subtraction of each mel bin's mean over the utterance.  torchaudio is
not a dependency.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

__all__ = ["SAMPLE_RATE", "LogMelFeatures", "hz_to_mel_htk", "mel_to_hz_htk", "mel_filterbank"]

SAMPLE_RATE = 16_000  # the rate the speaker network was trained at
LOG_FLOOR = 1e-6  # added before the log so silent frames stay finite


def hz_to_mel_htk(hz: Tensor) -> Tensor:
    """HTK mel scale: ``2595 * log10(1 + f / 700)``."""
    return 2595.0 * torch.log10(1.0 + hz / 700.0)


def mel_to_hz_htk(mel: Tensor) -> Tensor:
    """Inverse of :func:`hz_to_mel_htk`."""
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_filterbank(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int) -> Tensor:
    """Triangular HTK-scale filters without area normalisation, ``[n_freqs, n_mels]`` float64.

    Filter ``m`` rises linearly (in Hz) from corner ``m`` to ``m + 1`` and falls to ``m + 2``, the
    ``n_mels + 2`` corners being equally spaced in mel between ``f_min`` and ``f_max``.  STFT bins are
    taken at ``linspace(0, sample_rate // 2, n_freqs)`` Hz, as torchaudio does.
    """
    freqs = torch.linspace(0, sample_rate // 2, n_freqs, dtype=torch.float64)
    mel_lo, mel_hi = hz_to_mel_htk(torch.tensor([float(f_min), float(f_max)], dtype=torch.float64))
    corners = mel_to_hz_htk(torch.linspace(float(mel_lo), float(mel_hi), n_mels + 2, dtype=torch.float64))
    widths = corners[1:] - corners[:-1]  # [n_mels + 1]
    offsets = corners[None, :] - freqs[:, None]  # [n_freqs, n_mels + 2]: corner minus bin frequency
    rising = -offsets[:, :-2] / widths[:-1]  # (f - lower) / (centre - lower)
    falling = offsets[:, 2:] / widths[1:]  # (upper - f) / (upper - centre)
    return torch.clamp(torch.minimum(rising, falling), min=0.0)


class LogMelFeatures(nn.Module):
    """Waveform ``[B, N]`` at 16 kHz -> mean-normalised log-mel features ``[B, n_mels, N // hop + 1]``.

    The window and filterbank are non-persistent buffers (computed here, never stored in checkpoints,
    matching upstream, whose feature extractor is attached after its strict weight load).  Everything
    runs in float32 whatever the input dtype, like torchaudio's transform with float32 buffers.
    """

    def __init__(
        self,
        sample_rate: int = SAMPLE_RATE,
        n_fft: int = 512,
        win_length: int = 400,
        hop_length: int = 160,
        n_mels: int = 80,
        f_min: float = 0.0,
        f_max: float | None = None,
    ) -> None:
        super().__init__()
        if win_length > n_fft:
            raise ValueError(f"win_length ({win_length}) must not exceed n_fft ({n_fft})")
        self.sample_rate = sample_rate
        self.n_fft = n_fft
        self.win_length = win_length
        self.hop_length = hop_length
        self.n_mels = n_mels
        f_max = sample_rate / 2 if f_max is None else f_max
        # Periodic Hann: 0.5 - 0.5 cos(2 pi n / L); torch.stft centres it inside the n_fft frame.
        n = torch.arange(win_length, dtype=torch.float64)
        window = 0.5 - 0.5 * torch.cos(2 * math.pi * n / win_length)
        self.register_buffer("window", window.float(), persistent=False)
        fbank = mel_filterbank(n_fft // 2 + 1, f_min, f_max, n_mels, sample_rate)
        self.register_buffer("fbank", fbank.float(), persistent=False)

    def num_frames(self, num_samples: int) -> int:
        """Frames produced for ``num_samples`` samples (centred STFT)."""
        return num_samples // self.hop_length + 1

    def mel_power(self, wav: Tensor) -> Tensor:
        """Mel power spectrogram ``[B, n_mels, frames]`` (float32) of ``wav [B, N]``."""
        if wav.dim() != 2:
            raise ValueError(f"expected a waveform [B, N], got shape {tuple(wav.shape)}")
        if wav.shape[-1] <= self.n_fft // 2:
            # Reflect padding by n_fft // 2 needs more samples than that.
            raise ValueError(f"need more than {self.n_fft // 2} samples, got {wav.shape[-1]}")
        spec = torch.stft(
            wav.float(),
            n_fft=self.n_fft,
            hop_length=self.hop_length,
            win_length=self.win_length,
            window=self.window,
            center=True,
            pad_mode="reflect",
            normalized=False,
            onesided=True,
            return_complex=True,
        )  # [B, n_fft // 2 + 1, frames]
        power = spec.real.square() + spec.imag.square()
        return torch.matmul(self.fbank.T, power)

    def forward(self, wav: Tensor) -> Tensor:
        """Log-mel features with each mel bin's mean over time removed, ``[B, n_mels, frames]``."""
        feats = torch.log(self.mel_power(wav) + LOG_FLOOR)
        return feats - feats.mean(dim=-1, keepdim=True)
