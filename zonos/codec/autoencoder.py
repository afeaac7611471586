"""``DACAutoencoder``: the codec that turns audio into Zonos' code frames and back.

It is a plain object holding a :class:`~zonos.codec.dac.DAC` module (not an ``nn.Module``), so the
codec's weights stay out of the Zonos state dict, as upstream.  Weights come from the Hugging Face
repository ``descript/dac_44khz`` (``config.json`` + ``model.safetensors``), from a local copy of
it, or from one of Descript's original ``.pth`` files.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from zonos.audio import check_sample_rate, check_waveform, resample
from zonos.checkpoint import load_safetensors
from zonos.codec.dac import DAC, DACConfig, convert_descript_state_dict, load_state_dict_strict
from zonos.errors import CheckpointError, ZonosInputError
from zonos.hub import CheckpointNotAvailableError, resolve_file
from zonos.utils import on_meta
from zonos.validation import code_range

__all__ = [
    "DACAutoencoder",
    "CodecNotAvailableError",
    "DEFAULT_REPO_ID",
    "ENCODE_CHUNK_FRAMES",
    "decode_precision",
    "encoder_context_frames",
    "validate_codes",
]

DEFAULT_REPO_ID = "descript/dac_44khz"
_CONFIG_NAME = "config.json"
_WEIGHTS_NAME = "model.safetensors"
# encode() runs the encoder over windows of this many frames (~3 s at 44.1 kHz) plus its receptive field on
# either side, so a long clip costs memory for one window, not for the whole clip (a 10-minute clip took 4 GB
# one-shot with the tiny test codec; at full width a 3 s window's widest activation is 64 x 131072 x 4 B = 34 MB).
ENCODE_CHUNK_FRAMES = 256


# The codec's name for a checkpoint that cannot be found (kept for callers that catch it).
CodecNotAvailableError = CheckpointNotAvailableError


@contextlib.contextmanager
def decode_precision(device: torch.device, fp16_autocast: bool | None = None) -> Iterator[None]:
    """The numeric mode of decoding: fp16 autocast on CUDA (as upstream Zonos), plain fp32 elsewhere.

    ``fp16_autocast`` overrides the choice (``None``: autocast exactly when ``device`` is CUDA).
    """
    if fp16_autocast is None:
        fp16_autocast = device.type == "cuda"
    if fp16_autocast:
        with torch.autocast(device.type, dtype=torch.float16):
            yield
    else:
        yield


class DACAutoencoder:
    """Encode waveforms to DAC codes ``[B, 9, T]`` and decode codes back to 44.1 kHz audio.

    Args:
        config: the codec's hyper-parameters.
        weights: a state dict in the Hugging Face ``DacModel`` layout, or a built :class:`DAC`
            module (its own config then wins); ``None`` keeps random weights (tests only).
        device: where the module lives.
        source: names the weights' origin in error messages.
    """

    def __init__(
        self,
        config: DACConfig,
        weights: Mapping[str, Tensor] | DAC | None = None,
        device: str | torch.device = "cpu",
        *,
        source: str = "checkpoint",
    ) -> None:
        if isinstance(weights, DAC):
            module = weights
        elif weights is None:
            module = DAC(config)
        else:
            # Allocate without running the random initialisers: every tensor is overwritten anyway.
            with on_meta():
                module = DAC(config)
            module = module.to_empty(device=device)
            load_state_dict_strict(module, weights, source=source)
        self.config = module.config
        self.dac = module.eval().requires_grad_(False).to(device)

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def from_local(cls, directory: str | Path, device: str | torch.device = "cpu") -> DACAutoencoder:
        """Load ``config.json`` + ``model.safetensors`` (Hugging Face layout) from ``directory``."""
        directory = Path(directory)
        config_path, weights_path = directory / _CONFIG_NAME, directory / _WEIGHTS_NAME
        missing = [p.name for p in (config_path, weights_path) if not p.is_file()]
        if missing:
            raise CodecNotAvailableError(
                f"{directory} lacks {' and '.join(missing)}; a DAC directory needs {_CONFIG_NAME} and "
                f"{_WEIGHTS_NAME} (e.g. from `hf download {DEFAULT_REPO_ID} --local-dir DIR`)"
            )
        return cls._from_files(config_path, weights_path, device)

    @classmethod
    def _from_files(cls, config_path: Path, weights_path: Path, device: str | torch.device) -> DACAutoencoder:
        config = DACConfig.from_json(config_path)
        weights = load_safetensors(weights_path, device=device)  # checked and converted where they will run
        return cls(config, weights, device=device, source=str(weights_path))

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str = DEFAULT_REPO_ID,
        revision: str | None = None,
        device: str | torch.device = "cpu",
        cache_dir: str | Path | None = None,
    ) -> DACAutoencoder:
        """Load from the Hugging Face Hub (or its local cache); a local directory path also works."""
        config_path = resolve_file(repo_id, _CONFIG_NAME, revision, cache_dir)
        weights_path = resolve_file(repo_id, _WEIGHTS_NAME, revision, cache_dir)
        return cls._from_files(config_path, weights_path, device)

    @classmethod
    def from_descript_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu") -> DACAutoencoder:
        """Load one of Descript's original ``.pth`` files (``weights_44khz_8kbps_*.pth``)."""
        try:
            checkpoint = torch.load(str(path), map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such file; pass one of Descript's weights_44khz_*.pth") from None
        except Exception as e:  # unpickling and zip errors come as several types
            raise CheckpointError(
                f"could not read {path} as a torch checkpoint ({type(e).__name__}: {e}); it is probably "
                "truncated or corrupted: download it again"
            ) from None
        kwargs = checkpoint.get("metadata", {}).get("kwargs", {}) if isinstance(checkpoint, Mapping) else {}
        config = _config_from_descript_kwargs(kwargs)
        weights = convert_descript_state_dict(checkpoint, num_blocks=len(config.upsampling_ratios))
        return cls(config, weights, device=device, source=str(path))

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json`` + ``model.safetensors`` (readable by :meth:`from_local` and transformers)."""
        import json

        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / _CONFIG_NAME, "w", encoding="utf-8") as f:
            json.dump({"architectures": ["DacModel"], **self.config.to_dict()}, f, indent=2, sort_keys=True)
            f.write("\n")
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.dac.state_dict().items()}
        save_file(state, str(directory / _WEIGHTS_NAME))

    # -- properties ----------------------------------------------------------------------------

    @property
    def sampling_rate(self) -> int:
        """Audio samples per second (44100)."""
        return self.config.sampling_rate

    @property
    def codebook_size(self) -> int:
        """Entries per codebook (1024): codes lie in 0 .. codebook_size - 1."""
        return self.config.codebook_size

    @property
    def num_codebooks(self) -> int:
        """Codebooks per frame (9)."""
        return self.config.n_codebooks

    @property
    def hop_length(self) -> int:
        """Audio samples per code frame (512)."""
        return self.config.hop_length

    @property
    def device(self) -> torch.device:
        """Where the codec's weights are."""
        return next(self.dac.parameters()).device

    def to(self, device: str | torch.device) -> DACAutoencoder:
        """Move the codec to ``device`` (in place); returns ``self``."""
        self.dac.to(device)
        return self

    # -- audio <-> codes -----------------------------------------------------------------------

    def preprocess(self, wav: Tensor, sr: int) -> Tensor:
        """Resample ``wav [..., N]`` to the codec's rate and right-pad with zeros to a multiple of the hop.

        ``wav`` must be finite floating point (a waveform scaled like int16 PCM is rescaled with a warning) and
        ``sr`` a whole number of Hz in 8000..768000 (see :func:`zonos.audio.check_sample_rate`); otherwise
        :class:`~zonos.errors.ZonosInputError`, before any resampling.
        """
        sr = check_sample_rate(sr)
        wav = check_waveform(wav)
        wav = resample(wav, sr, self.sampling_rate)
        pad = -wav.shape[-1] % self.hop_length
        return F.pad(wav, (0, pad)) if pad else wav

    @torch.no_grad()
    def encode(self, wav: Tensor) -> Tensor:
        """Codes ``[B, num_codebooks, N / hop_length]`` (int64) of a preprocessed waveform ``[B, 1, N]``.

        Long clips are encoded in windows of :data:`ENCODE_CHUNK_FRAMES` frames, each with the encoder's
        receptive field of real context on both sides, so memory stays bounded and the codes equal those of
        one pass over the whole clip.
        """
        if not isinstance(wav, Tensor) or wav.dim() != 3 or wav.shape[1] != 1:
            shape = tuple(wav.shape) if isinstance(wav, Tensor) else type(wav).__name__
            raise ZonosInputError(f"encode expects a mono waveform batch [B, 1, N]; got {shape}")
        if not torch.is_floating_point(wav):
            raise ZonosInputError(f"encode expects a floating-point waveform, got {wav.dtype}")
        if wav.shape[-1] == 0 or wav.shape[-1] % self.hop_length:
            raise ZonosInputError(
                f"waveform length {wav.shape[-1]} is not a positive multiple of {self.hop_length}; "
                "call preprocess(wav, sr) first"
            )
        wav = check_waveform(wav)
        param = next(self.dac.parameters())
        wav = wav.to(param.device, param.dtype)
        hop = self.hop_length
        frames = wav.shape[-1] // hop
        context = encoder_context_frames(self.config)
        if frames <= ENCODE_CHUNK_FRAMES + 2 * context:
            return self.dac.encode(wav)
        chunks = []
        for start in range(0, frames, ENCODE_CHUNK_FRAMES):
            stop = min(start + ENCODE_CHUNK_FRAMES, frames)
            lo, hi = max(start - context, 0), min(stop + context, frames)
            codes = self.dac.encode(wav[..., lo * hop : hi * hop])
            chunks.append(codes[..., start - lo : stop - lo])
        return torch.cat(chunks, dim=-1)

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """Waveform ``[B, 1, hop_length * T]`` (float32, in ``[-1, 1]``) of codes ``[B, num_codebooks, T]``."""
        codes = self.check_codes(codes).to(self.device)
        if codes.shape[-1] == 0:  # convs reject empty inputs
            return torch.zeros(codes.shape[0], 1, 0, device=self.device)
        with decode_precision(self.device):
            wav = self.dac.decode(codes)
        return wav.float()

    def check_codes(self, codes: Tensor) -> Tensor:
        """Validate codes ``[B, num_codebooks, T]`` (integers in ``0 .. codebook_size - 1``); returns int64."""
        return validate_codes(codes, self.num_codebooks, self.codebook_size)


def encoder_context_frames(config: DACConfig) -> int:
    """Frames of input either side that one latent frame of the encoder depends on (its receptive field), rounded
    up: a window starting on a frame boundary with this much real context computes its interior frames exactly
    as a pass over the whole signal does (4244 samples, 9 frames, for the 44.1 kHz model)."""
    samples, jump = 3, 1  # conv1: kernel 7, padding 3
    for stride in config.downsampling_ratios:
        samples += sum(3 * d * jump for d in (1, 3, 9))  # three residual units, kernel 7 at dilations 1, 3, 9
        pad = math.ceil(stride / 2)  # the strided conv: kernel 2 * stride, padding ceil(stride / 2)
        samples += max(pad, 2 * stride - 1 - pad) * jump
        jump *= stride
    samples += jump  # conv2: kernel 3, padding 1, at the frame rate
    return -(-samples // config.hop_length)


def validate_codes(codes: Tensor, num_codebooks: int, codebook_size: int, *, values: bool = True) -> Tensor:
    """Check that ``codes`` is an integer tensor ``[B, num_codebooks, T]`` of valid code values.

    Raises :class:`~zonos.errors.ZonosInputError` naming the problem; returns the codes as int64.  Any integer
    dtype is accepted (the range is compared as Python ints, so uint8 or int16 codes cannot wrap around).
    ``values=False`` checks the shape and dtype only (reading the values of CUDA codes waits for the GPU).
    """
    if not isinstance(codes, Tensor):
        raise ZonosInputError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.dim() != 3 or codes.shape[1] != num_codebooks:
        raise ZonosInputError(f"codes must have shape [B, {num_codebooks}, T]; got {tuple(codes.shape)}")
    if torch.is_floating_point(codes) or torch.is_complex(codes) or codes.dtype == torch.bool:
        raise ZonosInputError(f"codes must be an integer tensor (int64), got {codes.dtype}")
    if values and codes.numel():
        check_code_range(*code_range(codes), codebook_size)
    return codes.long()


def check_code_range(lo: int, hi: int, codebook_size: int) -> None:
    """Raise :class:`~zonos.errors.ZonosInputError` unless codes with values in ``lo..hi`` are valid."""
    if lo < 0 or hi >= codebook_size:
        raise ZonosInputError(
            f"codes must lie in 0..{codebook_size - 1}; got values in {lo}..{hi}. Replace the "
            f"generator's special codes (EOS {codebook_size}, MASK {codebook_size + 1}) with 0 "
            f"first, e.g. codes.masked_fill(codes >= {codebook_size}, 0)"
        )


def _config_from_descript_kwargs(kwargs: Mapping[str, object]) -> DACConfig:
    """DACConfig from the constructor arguments that Descript stores in a ``.pth``'s metadata."""
    defaults = DACConfig()
    encoder_dim = int(kwargs.get("encoder_dim", defaults.encoder_hidden_size))
    encoder_rates = list(kwargs.get("encoder_rates", defaults.downsampling_ratios))
    latent_dim = kwargs.get("latent_dim") or encoder_dim * 2 ** len(encoder_rates)
    codebook_dim = kwargs.get("codebook_dim", defaults.codebook_dim)
    if not isinstance(codebook_dim, int):
        raise ValueError(f"per-codebook dimensions ({codebook_dim}) are not supported")
    return DACConfig(
        encoder_hidden_size=encoder_dim,
        downsampling_ratios=encoder_rates,
        decoder_hidden_size=int(kwargs.get("decoder_dim", defaults.decoder_hidden_size)),
        upsampling_ratios=list(kwargs.get("decoder_rates", defaults.upsampling_ratios)),
        n_codebooks=int(kwargs.get("n_codebooks", defaults.n_codebooks)),
        codebook_size=int(kwargs.get("codebook_size", defaults.codebook_size)),
        codebook_dim=codebook_dim,
        hidden_size=int(latent_dim),
        sampling_rate=int(kwargs.get("sample_rate", defaults.sampling_rate)),
    )
