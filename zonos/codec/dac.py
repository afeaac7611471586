"""Descript Audio Codec (DAC) as plain ``torch.nn`` modules.

The module tree mirrors the parameter names of the Hugging Face checkpoint ``descript/dac_44khz``
(``encoder.*``, ``decoder.*``, ``quantizer.quantizers.{q}.{in_proj,out_proj,codebook}``), so its
``model.safetensors`` loads with a strict ``load_state_dict``.  Descript's original ``.pth`` files use
other module names and weight-normalised convolutions; :func:`convert_descript_state_dict` maps them.

Shapes: audio ``[B, 1, N]``, latent ``[B, hidden_size, T]`` with ``N = hop_length * T``, codes
``[B, n_codebooks, T]`` (int64, values in ``0 .. codebook_size - 1``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zonos.checkpoint import CheckpointMismatchError, check_state_dict
from zonos.config import read_json
from zonos.errors import CheckpointError, ZonosInputError
from zonos.ops.backend import UsesOps
from zonos.utils import tensor_version
from zonos.validation import check_int

__all__ = [
    "DAC",
    "DACConfig",
    "CheckpointMismatchError",
    "Snake1d",
    "ResidualUnit",
    "convert_descript_state_dict",
    "load_state_dict_strict",
]


@dataclass
class DACConfig:
    """Hyper-parameters of a DAC model, named as in the Hugging Face ``config.json``.

    The defaults are those of ``descript/dac_44khz``.  (A bare transformers ``DacConfig()`` differs:
    its ``sampling_rate`` defaults to 16000.)
    """

    encoder_hidden_size: int = 64
    downsampling_ratios: list[int] = field(default_factory=lambda: [2, 4, 8, 8])
    decoder_hidden_size: int = 1536
    upsampling_ratios: list[int] = field(default_factory=lambda: [8, 8, 4, 2])
    n_codebooks: int = 9
    codebook_size: int = 1024
    codebook_dim: int = 8
    hidden_size: int = 1024
    sampling_rate: int = 44100

    def __post_init__(self) -> None:
        self.downsampling_ratios = [int(r) for r in self.downsampling_ratios]
        self.upsampling_ratios = [int(r) for r in self.upsampling_ratios]
        if math.prod(self.downsampling_ratios) != math.prod(self.upsampling_ratios):
            raise ValueError(
                f"downsampling_ratios {self.downsampling_ratios} and upsampling_ratios "
                f"{self.upsampling_ratios} must have the same product (the hop length)"
            )
        if self.decoder_hidden_size % 2 ** len(self.upsampling_ratios):
            raise ValueError(
                f"decoder_hidden_size {self.decoder_hidden_size} must be divisible by "
                f"2**{len(self.upsampling_ratios)} (it halves at every decoder block)"
            )

    @property
    def hop_length(self) -> int:
        """Audio samples per code frame (product of the strides; 512 for the 44.1 kHz model)."""
        return math.prod(self.downsampling_ratios)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DACConfig:
        """Build from a ``config.json`` mapping; unknown keys (loss weights, ``model_type``...) are ignored.
        Wrongly typed values raise :class:`~zonos.errors.CheckpointError` naming the key."""
        if not isinstance(data, Mapping):
            raise CheckpointError(f"not a DAC config.json: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        try:
            for key, value in values.items():
                if key.endswith("_ratios"):
                    if not isinstance(value, list) or not value:
                        raise ZonosInputError(f"{key} must be a non-empty list of integers, got {value!r}")
                    for i, r in enumerate(value):
                        check_int(f"{key}[{i}]", r, 1)
                else:
                    check_int(key, value, 1)
            config = cls(**values)
            hop = data.get("hop_length")
            if hop is not None and check_int("hop_length", hop, 1) != config.hop_length:
                raise ZonosInputError(
                    f"config hop_length {hop} does not match the product of downsampling_ratios ({config.hop_length})"
                )
        except CheckpointError:
            raise
        except ZonosInputError as e:
            raise CheckpointError(f"DAC config: {e}") from None
        except ValueError as e:  # __post_init__'s consistency checks
            raise CheckpointError(f"DAC config: {e}") from None
        return config

    @classmethod
    def from_json(cls, path: str | Path) -> DACConfig:
        """Read a Hugging Face style ``config.json``; problems raise CheckpointError naming the file."""
        data = read_json(path, "the DAC codec's config.json")
        try:
            return cls.from_dict(data)
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The fields plus the derived ``hop_length`` and ``model_type``, as written to ``config.json``."""
        data = asdict(self)
        data["hop_length"] = self.hop_length
        data["model_type"] = "dac"
        return data


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def conv_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype a conv of ``x`` by ``weight`` computes in: autocast's where it is on (it leaves float64
    alone), else the promoted dtype."""
    dtype = torch.promote_types(x.dtype, weight.dtype)
    device = x.device.type
    if torch.is_autocast_enabled(device) and dtype != torch.float64:
        return torch.get_autocast_dtype(device)
    return dtype


class Snake1d(UsesOps, nn.Module):
    """Snake activation ``x + sin(alpha * x)**2 / alpha`` with one ``alpha`` per channel (:func:`zonos.ops.snake`)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.ops.snake(x, self.alpha)


class ResidualUnit(UsesOps, nn.Module):
    """``x + conv2(snake2(conv1(snake1(x))))`` with a dilated kernel-7 conv1 and a kernel-1 conv2.

    The Snakes and convs are the :mod:`zonos.ops` calls the streaming decoder makes (each Snake rounded to the
    conv's dtype, snake2 applied by conv1 and the residual added by conv2), so both compute the same sums;
    "same" padding keeps the lengths equal.
    """

    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.snake1 = Snake1d(channels)
        self.conv1 = nn.Conv1d(channels, channels, 7, dilation=dilation, padding=3 * dilation)
        self.snake2 = Snake1d(channels)
        self.conv2 = nn.Conv1d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        dtype = conv_dtype(x, self.conv1.weight)
        (d,), (p,) = self.conv1.dilation, self.conv1.padding
        h = self.ops.snake(x, self.snake1.alpha, dtype)
        h = self.ops.conv1d(
            h, self.conv1.weight, self.conv1.bias, dilation=d, padding=p, alpha=self.snake2.alpha, dtype=dtype
        )  # snake2 applied as conv1 stores
        return self.ops.conv1d(h, self.conv2.weight, self.conv2.bias, residual=x, dtype=dtype)


def _residual_stack(channels: int) -> tuple[ResidualUnit, ResidualUnit, ResidualUnit]:
    return ResidualUnit(channels, 1), ResidualUnit(channels, 3), ResidualUnit(channels, 9)


class EncoderBlock(nn.Module):
    """Three residual units at ``channels``, then a strided conv to ``2 * channels``."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.res_unit1, self.res_unit2, self.res_unit3 = _residual_stack(channels)
        self.snake1 = Snake1d(channels)
        self.conv1 = nn.Conv1d(channels, 2 * channels, 2 * stride, stride=stride, padding=math.ceil(stride / 2))

    def forward(self, x: Tensor) -> Tensor:
        x = self.res_unit3(self.res_unit2(self.res_unit1(x)))
        return self.conv1(self.snake1(x))


class DecoderBlock(UsesOps, nn.Module):
    """Snake, an upsampling transposed conv (``in_channels -> out_channels``), three residual units."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.snake1 = Snake1d(in_channels)
        self.conv_t1 = nn.ConvTranspose1d(
            in_channels, out_channels, 2 * stride, stride=stride, padding=math.ceil(stride / 2)
        )
        self.res_unit1, self.res_unit2, self.res_unit3 = _residual_stack(out_channels)

    def forward(self, x: Tensor) -> Tensor:
        conv = self.conv_t1
        (s,), (p,) = conv.stride, conv.padding
        length = (x.shape[-1] - 1) * s + conv.kernel_size[0] - 2 * p
        dtype = conv_dtype(x, conv.weight)
        x = self.ops.snake(x, self.snake1.alpha, dtype)
        x = self.ops.conv_transpose1d(x, conv.weight, conv.bias, stride=s, start=p, length=length, dtype=dtype)
        return self.res_unit3(self.res_unit2(self.res_unit1(x)))


class Encoder(nn.Module):
    """Waveform ``[B, 1, N]`` to latent ``[B, hidden_size, N / hop_length]``."""

    def __init__(self, config: DACConfig) -> None:
        super().__init__()
        width = config.encoder_hidden_size
        self.conv1 = nn.Conv1d(1, width, 7, padding=3)
        blocks = []
        for stride in config.downsampling_ratios:
            blocks.append(EncoderBlock(width, stride))
            width *= 2
        self.block = nn.ModuleList(blocks)
        self.snake1 = Snake1d(width)
        self.conv2 = nn.Conv1d(width, config.hidden_size, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))


class Decoder(UsesOps, nn.Module):
    """Latent ``[B, hidden_size, T]`` to waveform ``[B, 1, hop_length * T]`` in ``[-1, 1]``."""

    def __init__(self, config: DACConfig) -> None:
        super().__init__()
        width = config.decoder_hidden_size
        self.conv1 = nn.Conv1d(config.hidden_size, width, 7, padding=3)
        blocks = []
        for stride in config.upsampling_ratios:
            blocks.append(DecoderBlock(width, width // 2, stride))
            width //= 2
        self.block = nn.ModuleList(blocks)
        self.snake1 = Snake1d(width)
        self.conv2 = nn.Conv1d(width, 1, 7, padding=3)

    def forward(self, z: Tensor) -> Tensor:
        dtype = conv_dtype(z, self.conv1.weight)
        x = self.ops.conv1d(z, self.conv1.weight, self.conv1.bias, padding=self.conv1.padding[0], dtype=dtype)
        for block in self.block:
            x = block(x)
        x = self.ops.snake(x, self.snake1.alpha, dtype)
        conv = self.conv2
        return self.ops.conv1d(x, conv.weight, conv.bias, padding=conv.padding[0], tanh=True, dtype=dtype)


class VectorQuantizer(nn.Module):
    """One residual-VQ stage: project down, cosine nearest neighbour in the codebook, project up."""

    def __init__(self, hidden_size: int, codebook_size: int, codebook_dim: int) -> None:
        super().__init__()
        self.in_proj = nn.Conv1d(hidden_size, codebook_dim, 1)
        self.out_proj = nn.Conv1d(codebook_dim, hidden_size, 1)
        self.codebook = nn.Embedding(codebook_size, codebook_dim)

    def nearest(self, projected: Tensor) -> Tensor:
        """Codes ``[B, T]`` of the codebook rows with the highest cosine similarity to ``[B, D, T]``."""
        query = F.normalize(projected.transpose(1, 2), dim=-1)  # [B, T, D]
        keys = F.normalize(self.codebook.weight, dim=-1)  # [K, D]
        return (query @ keys.t()).argmax(dim=-1)


class ResidualVectorQuantizer(nn.Module):
    """``n_codebooks`` VQ stages, each quantising what the previous ones left over."""

    def __init__(self, config: DACConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(
            VectorQuantizer(config.hidden_size, config.codebook_size, config.codebook_dim)
            for _ in range(config.n_codebooks)
        )


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class DAC(UsesOps, nn.Module):
    """Encoder, residual vector quantiser and decoder of the Descript Audio Codec."""

    def __init__(self, config: DACConfig | None = None) -> None:
        super().__init__()
        self.config = config or DACConfig()
        self.encoder = Encoder(self.config)
        self.decoder = Decoder(self.config)
        self.quantizer = ResidualVectorQuantizer(self.config)
        self._stacked: dict[int, tuple] = {}  # see _stacked_codebooks

    @property
    def hop_length(self) -> int:
        return self.config.hop_length

    def encode_latent(self, wav: Tensor) -> Tensor:
        """Continuous latent ``[B, hidden_size, N / hop_length]`` of a waveform ``[B, 1, N]``."""
        return self.encoder(wav)

    def quantize(self, latent: Tensor) -> Tensor:
        """Residual-VQ codes ``[B, n_codebooks, T]`` (int64) of a latent ``[B, hidden_size, T]``."""
        residual = latent
        codes = []
        for vq in self.quantizer.quantizers:
            projected = vq.in_proj(residual)
            code = vq.nearest(projected)
            row = vq.codebook(code).transpose(1, 2)
            # Written as projected + (row - projected), the reference's straight-through form; it is
            # row up to rounding, and matching the rounding keeps later stages' argmax identical.
            residual = residual - vq.out_proj(projected + (row - projected))
            codes.append(code)
        return torch.stack(codes, dim=1)

    def codes_to_latent(self, codes: Tensor, bounds: Tensor | None = None) -> Tensor:
        """Sum of every stage's contribution: latent ``[B, hidden_size, T]`` of codes ``[B, Q, T]``.

        Every stage's ``out_proj(codebook row)`` is linear, so the sum is one kernel-1 conv of the Q stacked
        codebook rows (``[B, Q * codebook_dim, T]``) by the Q out_proj weights side by side, plus the summed
        biases: a lookup and a conv instead of three launches per codebook.  ``bounds``: see
        :func:`zonos.ops.codebook_rows`.
        """
        if codes.dim() != 3:
            raise ValueError(f"codes must be [B, n_codebooks, T]; got shape {tuple(codes.shape)}")
        q = codes.shape[1]
        if q > len(self.quantizer.quantizers):
            raise ValueError(f"codes have {q} codebooks, the model has {len(self.quantizer.quantizers)}")
        tables, weight, bias = self._stacked_codebooks(q)
        rows = self.ops.codebook_rows(codes, tables, self.config.codebook_size, bounds)
        # Through the decoder's conv op, whose sums do not depend on T: a stream's latent equals the one-shot one.
        return self.ops.conv1d(rows, weight, bias, dtype=conv_dtype(rows, weight))

    def _stacked_codebooks(self, q: int) -> tuple[Tensor, Tensor, Tensor]:
        """(codebooks ``[Q * codebook_size, D]``, out_proj weights ``[hidden, Q * D, 1]``, summed biases) of the
        first ``q`` stages.  Kept, per ``q``, until one of those weights changes (in place, moved or replaced): a
        streaming push of a few frames would otherwise stack them anew, four launches.  (CUDA graphs of pushes read
        the kept copies: a streaming decoder recaptures its graphs when the weights change.)"""
        used = self.quantizer.quantizers[:q]
        params = [t for vq in used for t in (vq.codebook.weight, vq.out_proj.weight, vq.out_proj.bias)]
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return self._stack(used)  # a kept copy would cut the autograd graph
        key = tuple((p.data_ptr(), p.device, p.dtype, tensor_version(p)) for p in params)
        if q not in self._stacked or self._stacked[q][0] != key:
            with torch.no_grad():
                self._stacked[q] = (key, *self._stack(used))
        return self._stacked[q][1:]

    @staticmethod
    def _stack(used: Sequence[nn.Module]) -> tuple[Tensor, Tensor, Tensor]:
        tables = torch.cat([vq.codebook.weight for vq in used])
        weight = torch.cat([vq.out_proj.weight for vq in used], dim=1)
        bias = torch.stack([vq.out_proj.bias for vq in used]).sum(0)
        return tables, weight, bias

    def decode_latent(self, latent: Tensor) -> Tensor:
        """Waveform ``[B, 1, hop_length * T]`` of a latent ``[B, hidden_size, T]``."""
        return self.decoder(latent)

    def encode(self, wav: Tensor) -> Tensor:
        """Codes ``[B, n_codebooks, N / hop_length]`` of a waveform ``[B, 1, N]``."""
        return self.quantize(self.encode_latent(wav))

    def decode(self, codes: Tensor) -> Tensor:
        """Waveform ``[B, 1, hop_length * T]`` of codes ``[B, n_codebooks, T]``."""
        return self.decode_latent(self.codes_to_latent(codes))


# ---------------------------------------------------------------------------------------------
# Checkpoint loading
# ---------------------------------------------------------------------------------------------


def load_state_dict_strict(module: nn.Module, state_dict: Mapping[str, Tensor], source: str = "checkpoint") -> None:
    """Load ``state_dict`` into ``module``, raising one error that lists every problem."""
    check_state_dict(
        module.state_dict(),
        state_dict,
        source,
        "the DAC model built from its config",
        "Check that config.json belongs to these weights (Hugging Face DacModel layout).",
    )
    module.load_state_dict(state_dict, strict=True)


def _fuse_weight_norm(g: Tensor, v: Tensor) -> Tensor:
    """``g * v / ||v||`` with the norm over every axis but 0 (torch's weight_norm with dim=0)."""
    norm = v.flatten(1).norm(dim=1).reshape((-1,) + (1,) * (v.dim() - 1))
    return g * (v / norm)


# Descript's residual units are ``nn.Sequential(snake, conv, snake, conv)``.
_RES_UNIT_PARTS = ("snake1", "conv1", "snake2", "conv2")


def _rename_descript_key(name: str, num_blocks: int) -> str:
    """Hugging Face module path of one of Descript's module paths (parameter suffix stripped)."""
    if name.startswith("quantizer."):
        return name  # same layout in both
    if m := re.fullmatch(r"encoder\.block\.(\d+)(.*)", name):
        idx, rest = int(m[1]), m[2]
        if idx == 0:
            return "encoder.conv1" + rest
        if idx == num_blocks + 1:
            return "encoder.snake1" + rest
        if idx == num_blocks + 2:
            return "encoder.conv2" + rest
        block = f"encoder.block.{idx - 1}"
        if sub := re.fullmatch(r"\.block\.(\d+)(.*)", rest):
            j, tail = int(sub[1]), sub[2]
            if j < 3:
                return block + _rename_res_unit(j, tail)
            if j == 3:
                return block + ".snake1" + tail
            if j == 4:
                return block + ".conv1" + tail
    elif m := re.fullmatch(r"decoder\.model\.(\d+)(.*)", name):
        idx, rest = int(m[1]), m[2]
        if idx == 0:
            return "decoder.conv1" + rest
        if idx == num_blocks + 1:
            return "decoder.snake1" + rest
        if idx == num_blocks + 2:
            return "decoder.conv2" + rest
        block = f"decoder.block.{idx - 1}"
        if sub := re.fullmatch(r"\.block\.(\d+)(.*)", rest):
            j, tail = int(sub[1]), sub[2]
            if j == 0:
                return block + ".snake1" + tail
            if j == 1:
                return block + ".conv_t1" + tail
            if j < 5:
                return block + _rename_res_unit(j - 2, tail)
    raise KeyError(f"unrecognised Descript DAC parameter name: {name!r}")


def _rename_res_unit(unit: int, tail: str) -> str:
    sub = re.fullmatch(r"\.block\.(\d)(.*)", tail)
    if sub is None or int(sub[1]) >= len(_RES_UNIT_PARTS):
        raise KeyError(f"unrecognised residual-unit parameter path: {tail!r}")
    return f".res_unit{unit + 1}.{_RES_UNIT_PARTS[int(sub[1])]}{sub[2]}"


def convert_descript_state_dict(state_dict: Mapping[str, Any], num_blocks: int = 4) -> dict[str, Tensor]:
    """Convert a state dict of Descript's original DAC (``weights_44khz_*.pth``) to our names.

    Weight-normalised convs (``weight_g``/``weight_v``, or torch's newer
    ``parametrizations.weight.original0/1``) are fused into plain ``weight`` tensors, and Descript's
    ``nn.Sequential`` indices are renamed (e.g. ``decoder.model.1.block.1`` to
    ``decoder.block.0.conv_t1``).  A top-level ``{"state_dict": ...}`` wrapper (as saved by
    audiotools) is unwrapped.  ``num_blocks`` is the number of encoder/decoder stride blocks.
    """
    if "state_dict" in state_dict and isinstance(state_dict["state_dict"], Mapping):
        state_dict = state_dict["state_dict"]
    norm_parts: dict[str, dict[str, Tensor]] = {}
    out: dict[str, Tensor] = {}
    for key, tensor in state_dict.items():
        for suffix, part in (
            (".weight_g", "g"),
            (".weight_v", "v"),
            (".parametrizations.weight.original0", "g"),
            (".parametrizations.weight.original1", "v"),
        ):
            if key.endswith(suffix):
                norm_parts.setdefault(key[: -len(suffix)], {})[part] = tensor
                break
        else:
            module, _, param = key.rpartition(".")
            out[f"{_rename_descript_key(module, num_blocks)}.{param}"] = tensor
    for module, parts in norm_parts.items():
        if set(parts) != {"g", "v"}:
            raise KeyError(f"weight-normalised conv {module!r} lacks its {'g' if 'g' not in parts else 'v'} tensor")
        out[f"{_rename_descript_key(module, num_blocks)}.weight"] = _fuse_weight_norm(parts["g"], parts["v"])
    return out
