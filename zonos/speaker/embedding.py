"""Speaker embeddings for Zonos voice cloning: a waveform -> the 128-d LDA embedding ``[1, 1, 128]`` (bf16).

The weights are the two files of the Hub repo ``Zyphra/Zonos-v0.1-speaker-embedding``: the
ResNet293-SimAM-ASP network (``ResNet293_SimAM_ASP_base.pt``, 256-d output) and the LDA projection to
128 dims (``ResNet293_SimAM_ASP_base_LDA-128.pt``).  Both are torch-pickled state dicts; they are read
with ``weights_only=True`` and loaded strictly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from zonos.audio import check_sample_rate, check_waveform, resample
from zonos.checkpoint import CheckpointMismatchError, check_state_dict
from zonos.errors import ZonosInputError
from zonos.hub import CheckpointNotAvailableError, resolve_file
from zonos.speaker.features import SAMPLE_RATE, LogMelFeatures
from zonos.speaker.network import ResNetSimAMASP, SpeakerNetConfig
from zonos.utils import on_meta
from zonos.validation import check_device

__all__ = [
    "DEFAULT_REPO",
    "NETWORK_FILE",
    "LDA_FILE",
    "MAX_SECONDS",
    "MIN_SECONDS",
    "SpeakerCheckpointError",
    "SpeakerEmbedding",
    "check_speaker_clip",
    "load_speaker_embedding",
    "load_state_dict_strict",
]

DEFAULT_REPO = "Zyphra/Zonos-v0.1-speaker-embedding"
NETWORK_FILE = "ResNet293_SimAM_ASP_base.pt"
LDA_FILE = "ResNet293_SimAM_ASP_base_LDA-128.pt"
MIN_SECONDS = 0.5  # shorter clips carry too little speech for a usable voice embedding
# Longer clips are trimmed to their first MAX_SECONDS before resampling: the network's cost grows with the clip
# (its widest activation is 64 x 80 x frames floats, 61 MB at 30 s) and a voice is well captured by then.
MAX_SECONDS = 30.0
SILENCE_RMS = 1e-6  # below this the log-mel features are just the 1e-6 floor: nothing to embed


class SpeakerCheckpointError(CheckpointMismatchError):
    """A speaker-embedding checkpoint is unreadable or its tensors do not fit the network."""


def load_state_dict_strict(module: nn.Module, state_dict: object, source: str) -> None:
    """Strictly load ``state_dict`` into ``module`` (assigning its tensors, so ``module`` may be on meta).

    Raises :class:`SpeakerCheckpointError` listing every missing, unexpected and mis-shaped tensor.
    BatchNorm ``num_batches_tracked`` counters absent from the file are filled with 0: they only matter
    for training, and torch itself accepts their absence in old-format state dicts.
    """
    if not isinstance(state_dict, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state_dict.items()
    ):
        raise SpeakerCheckpointError(f"{source} does not hold a state dict of named tensors")
    expected = module.state_dict()
    given = dict(state_dict)
    for name in expected:
        if name.endswith("num_batches_tracked") and name not in given:
            given[name] = torch.zeros((), dtype=torch.long)
    check_state_dict(
        expected,
        given,
        source,
        "the speaker network",
        f"Is it the Zonos speaker-embedding checkpoint ({NETWORK_FILE} / {LDA_FILE}) and does the config match?",
        SpeakerCheckpointError,
    )
    module.load_state_dict(given, strict=True, assign=True)


def _torch_load(path: str | os.PathLike, mmap: bool) -> object:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointNotAvailableError(f"speaker-embedding checkpoint not found: {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # unpickling, zip and mmap errors come as several types
        if mmap:  # mmap needs the zip format; older files still load without it
            try:
                return torch.load(path, map_location="cpu", weights_only=True)
            except Exception:
                pass
        raise SpeakerCheckpointError(f"could not read {path} as a torch state dict: {e}") from e


def check_speaker_clip(wav: Tensor | np.ndarray, sr: int) -> tuple[Tensor, int]:
    """Validate one voice clip in microseconds, before any model is loaded or run; return it as
    ``[channels, samples]`` (trimmed to its first :data:`MAX_SECONDS`) and ``sr`` as an int.

    Raises :class:`~zonos.errors.ZonosInputError` for a sample rate outside 8000..768000 Hz (or a bool or string
    rate), a wrong shape or dtype, NaN/inf samples, or a clip shorter than :data:`MIN_SECONDS`; rescales a clip
    scaled like int16 PCM, with a warning.
    """
    sr = check_sample_rate(sr)
    if isinstance(wav, (Tensor, np.ndarray)) and wav.ndim not in (1, 2):
        raise ZonosInputError(
            f"expected one clip as [samples] or [channels, samples], got shape {tuple(wav.shape)}; "
            "embed clips one at a time"
        )
    if isinstance(wav, (Tensor, np.ndarray)) and wav.ndim == 2 and wav.shape[0] > wav.shape[1]:
        raise ZonosInputError(
            f"got shape {tuple(wav.shape)}, which looks like [samples, channels]; pass [channels, samples] "
            "(transpose it, e.g. wav.T)"
        )
    if isinstance(wav, (Tensor, np.ndarray)) and wav.shape[-1] > MAX_SECONDS * sr:
        # Trimmed before any other pass over the samples, so a long upload costs no more than MAX_SECONDS.
        wav = wav[..., : int(MAX_SECONDS * sr)]
    wav = check_waveform(wav, "the speaker clip")
    wav = wav if wav.dim() == 2 else wav[None]
    seconds = wav.shape[1] / sr
    if seconds < MIN_SECONDS:
        raise ZonosInputError(
            f"the clip is too short: {wav.shape[1]} samples at {sr} Hz = {seconds:.3f} s; the speaker "
            f"embedding needs at least {MIN_SECONDS} s ({int(np.ceil(MIN_SECONDS * sr))} samples), and "
            "several seconds of clean speech work best"
        )
    return wav, sr


_AUDIO_MAGIC = (b"RIFF", b"fLaC", b"OggS", b"ID3", b"FORM", b"\xff\xfb", b"\xff\xf3", b"\xff\xf2")


def load_speaker_embedding(path: str | os.PathLike, device: str | torch.device = "cpu") -> Tensor:
    """Read a speaker embedding saved with ``torch.save`` (what ``sample.py --speaker-embedding`` takes): a
    tensor of 128 finite values, returned as ``[1, 1, 128]`` on ``device`` in its saved dtype.

    Raises :class:`~zonos.errors.ZonosInputError` naming the file when it is missing, is an audio file (embed
    that with ``make_speaker_embedding`` / ``--speaker-audio`` instead), cannot be read, or does not hold such
    a tensor.
    """
    device = check_device("device", device)
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ZonosInputError(f"speaker embedding file not found: {path}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(_AUDIO_MAGIC):
        raise ZonosInputError(
            f"{path} is an audio file, not a saved speaker embedding; pass it as the speaker audio instead "
            "(sample.py --speaker-audio, or model.make_speaker_embedding(*load_audio(path)))"
        )
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling and zip errors come as several types
        raise ZonosInputError(
            f"could not read {path} as a speaker embedding saved with torch.save ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(value, Tensor) or value.numel() != 128 or not value.is_floating_point():
        what = (
            f"a {value.dtype} tensor of shape {tuple(value.shape)}"
            if isinstance(value, Tensor)
            else type(value).__name__
        )
        raise ZonosInputError(
            f"{path} holds {what}; a speaker embedding is 128 floating-point values, as saved by "
            "torch.save(model.make_speaker_embedding(wav, sr), path)"
        )
    if not bool(value.isfinite().all()):
        raise ZonosInputError(f"{path} holds NaN or infinite values; recompute the speaker embedding")
    return value.reshape(1, 1, 128).to(device)


class SpeakerEmbedding(nn.Module):
    """Waveform -> Zonos speaker embedding, the one entry point being :meth:`embed`.

    Holds the log-mel front end (``features``), the ResNet293-SimAM-ASP network (``network``) and the
    LDA projection (``lda``).  Weights stay float32 (as upstream loads them); frozen, in eval mode.
    """

    def __init__(self, network: ResNetSimAMASP, lda: nn.Linear) -> None:
        super().__init__()
        if lda.in_features != network.config.embed_dim:
            raise ValueError(f"LDA takes {lda.in_features} dims but the network gives {network.config.embed_dim}")
        self.features = LogMelFeatures(n_mels=network.config.n_mels)
        self.network = network
        self.lda = lda
        self.requires_grad_(False).eval()

    # ----------------------------------------------------------------------------------------- loading

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str | os.PathLike = DEFAULT_REPO,
        revision: str | None = None,
        device: str | torch.device = "cpu",
        cache_dir: str | None = None,
        config: SpeakerNetConfig | None = None,
    ) -> SpeakerEmbedding:
        """Load both checkpoint files from a Hub repo (default ``Zyphra/Zonos-v0.1-speaker-embedding``)
        or a local directory holding them; ``config`` as in :meth:`from_local`.

        Offline with nothing cached, raises ``FileNotFoundError`` saying how to fetch the files.
        """
        network_path = resolve_file(repo_id, NETWORK_FILE, revision, cache_dir)
        lda_path = resolve_file(repo_id, LDA_FILE, revision, cache_dir)
        return cls.from_local(network_path, lda_path, device=device, config=config)

    @classmethod
    def from_local(
        cls,
        network_path: str | os.PathLike,
        lda_path: str | os.PathLike,
        device: str | torch.device = "cpu",
        config: SpeakerNetConfig | None = None,
    ) -> SpeakerEmbedding:
        """Load from the two ``.pt`` files (network state dict, LDA ``{weight, bias}``).

        ``config`` defaults to the published sizes; the load is strict against it (see
        :func:`load_state_dict_strict`).  The network file is memory-mapped, as upstream does.
        """
        network_sd = _torch_load(network_path, mmap=True)
        lda_sd = _torch_load(lda_path, mmap=False)
        return cls.from_state_dicts(
            network_sd, lda_sd, device=device, config=config, sources=(os.fspath(network_path), os.fspath(lda_path))
        )

    @classmethod
    def from_state_dicts(
        cls,
        network_state_dict: Mapping[str, Tensor],
        lda_state_dict: Mapping[str, Tensor],
        device: str | torch.device = "cpu",
        config: SpeakerNetConfig | None = None,
        sources: tuple[str, str] = ("network state dict", "LDA state dict"),
    ) -> SpeakerEmbedding:
        """Build from in-memory state dicts (strict); parameters end up float32 on ``device``."""
        config = config or SpeakerNetConfig()
        # Built on meta and filled by assignment, so the 99M parameters are never randomly initialised.
        with on_meta():
            network = ResNetSimAMASP(config)
            lda = nn.Linear(config.embed_dim, config.lda_dim)
        load_state_dict_strict(network, network_state_dict, sources[0])
        load_state_dict_strict(lda, lda_state_dict, sources[1])
        # Module.to casts floating tensors only, so the BatchNorm counters stay int64.
        return cls(network, lda).to(device=device, dtype=torch.float32)

    # --------------------------------------------------------------------------------------- inference

    @property
    def device(self) -> torch.device:
        """Where the model's weights are."""
        return self.lda.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The network's parameter dtype (float32 unless changed)."""
        return self.network.bottleneck.weight.dtype

    def prepare(self, wav: Tensor | np.ndarray, sr: int) -> Tensor:
        """Validate one clip and return it as mono 16 kHz float32 ``[1, N]`` on the model's device.

        Channels are averaged; resampling uses :func:`zonos.audio.resample` (torchaudio's default
        windowed-sinc), as upstream resamples with ``torchaudio.transforms.Resample``.
        """
        wav, sr = check_speaker_clip(wav, sr)
        mono = wav.to(self.device, torch.float32).mean(dim=0, keepdim=True)
        rms = float(mono.double().square().mean().sqrt())
        if rms < SILENCE_RMS:
            raise ZonosInputError(
                f"the clip is silent (RMS {rms:.2e}); pass a recording of the speaker's voice "
                "(check that the file was read correctly and is not all zeros)"
            )
        return resample(mono, sr, SAMPLE_RATE)

    def forward(self, wav16k: Tensor) -> tuple[Tensor, Tensor]:
        """Mono 16 kHz waveform ``[B, N]`` -> (raw network embedding ``[B, 256]``, LDA embedding ``[B, 128]``),
        both float32.  No input checks: use :meth:`embed` for user audio."""
        feats = self.features(wav16k).to(self.dtype)
        raw = self.network(feats).float()
        return raw, self.lda(raw.to(self.lda.weight.dtype)).float()

    # no_grad rather than inference_mode: callers may use the result in ordinary (non-inference) code.
    @torch.no_grad()
    def embed(self, wav: Tensor | np.ndarray, sr: int) -> Tensor:
        """The Zonos speaker embedding of one clip: ``[1, 1, 128]`` bfloat16 on the model's device.

        ``wav`` is ``[samples]`` or ``[channels, samples]`` (channels are averaged), finite floating point in
        [-1, 1] (a clip scaled like int16 PCM is rescaled with a warning), at a sample rate ``sr`` of
        8000..768000 Hz; at least :data:`MIN_SECONDS` long and not silent, else
        :class:`~zonos.errors.ZonosInputError`. Only the first :data:`MAX_SECONDS` (30 s) are used: longer
        clips are trimmed, so the cost is bounded whatever the upload.
        As upstream ``Zonos.make_speaker_embedding`` does, this is the LDA output (not the raw 256-d
        embedding), given a leading ``[1, 1]`` shape and cast to bfloat16; it is what
        ``make_cond_dict(speaker=...)`` expects.
        """
        _, projected = self.forward(self.prepare(wav, sr))
        return projected.unsqueeze(0).to(torch.bfloat16)
