"""Conditioner modules, the model-level :class:`PrefixConditioner`, and :func:`make_cond_dict`.

Module and parameter names are chosen so that ``PrefixConditioner.state_dict()`` has exactly the
``prefix_conditioner.*`` keys (and shapes) of the published Zonos v0.1 checkpoints.

Input convention for the non-text conditioners: a tensor whose last axis holds the n input values, shaped
``[n]``, ``[B, n]`` or ``[B, T, n]``; the output is ``[B, T, d]`` (``[1, 1, d]`` for the ``[1, 1, n]`` tensors
that :func:`make_cond_dict` produces). A missing (``None``) input selects the learned unconditional vector.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

from ..config import PrefixConditionerConfig
from ..errors import CheckpointError, ZonosInputError
from ..utils import default_device
from ..validation import check_device, check_finite
from .languages import language_id, normalize_language
from .phonemes import VOCAB_SIZE, check_phonemes, check_text, phonemize, tokenize_phonemes

__all__ = [
    "Conditioner",
    "EspeakPhonemeConditioner",
    "PassthroughConditioner",
    "FourierConditioner",
    "IntegerConditioner",
    "PrefixConditioner",
    "build_conditioners",
    "make_cond_dict",
    "COND_KEYS",
    "DEFAULT_EMOTION",
]

Projection = Literal["none", "linear", "mlp"]


def _make_projection(kind: str, in_dim: int, out_dim: int) -> nn.Module:
    if kind == "linear":
        return nn.Linear(in_dim, out_dim)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(in_dim, out_dim), nn.SiLU(), nn.Linear(out_dim, out_dim))
    if kind == "none":
        return nn.Identity()
    raise CheckpointError(f"unknown projection {kind!r}; expected 'none', 'linear' or 'mlp'")


def _features(x: Any, n: int, name: str, device: torch.device) -> torch.Tensor:
    """Bring a conditioner input to ``[B, T, n]`` on ``device`` (dtype unchanged; lists become tensors), refusing
    strings, bools, complex and non-finite values."""
    if isinstance(x, (str, bytes)):
        raise ZonosInputError(f"conditioner {name!r} expects numbers, got the string {x[:40]!r}")
    try:
        x = torch.as_tensor(x, device=device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ZonosInputError(
            f"conditioner {name!r} expects a tensor or list of numbers, got {type(x).__name__} ({e})"
        ) from None
    if x.dtype == torch.bool or x.is_complex():
        raise ZonosInputError(f"conditioner {name!r} expects real numbers, got a {x.dtype} tensor")
    if x.device.type == "cpu":  # on a GPU this would wait for queued work; the prefix check in forward covers it
        check_finite(f"conditioner {name!r} input", x, "pass finite values (see make_cond_dict)")
    if x.dim() == 0:
        x = x.reshape(1)
    if x.shape[-1] != n:
        raise ZonosInputError(f"conditioner {name!r} expects {n} value(s) on the last axis, got shape {tuple(x.shape)}")
    if x.dim() == 1:
        return x.view(1, 1, n)
    if x.dim() == 2:
        return x.unsqueeze(1)  # [B, n]: one token per batch row
    if x.dim() == 3:
        return x
    raise ZonosInputError(f"conditioner {name!r} expects a tensor [n], [B, n] or [B, T, n], got shape {tuple(x.shape)}")


class Conditioner(nn.Module):
    """Base class: an input-specific :meth:`apply_cond`, an optional projection, an optional learned
    unconditional vector.

    Args:
        output_dim: model width d.
        name: the cond-dict key this conditioner reads.
        cond_dim: width of :meth:`apply_cond`'s output, i.e. the projection's input (defaults to d).
        projection: ``"none"`` (identity), ``"linear"`` or ``"mlp"`` (Linear, SiLU, Linear).
        uncond_type: ``"learned"`` adds the parameter ``uncond_vector`` [d], used when the input is missing.
    """

    def __init__(
        self,
        output_dim: int,
        name: str,
        cond_dim: int | None = None,
        projection: Projection = "none",
        uncond_type: Literal["learned", "none"] = "none",
    ) -> None:
        super().__init__()
        self.name = name
        self.output_dim = output_dim
        self.cond_dim = cond_dim or output_dim
        # Registration order (own parameter, then submodules) reproduces the checkpoint's key order.
        if uncond_type == "learned":
            self.uncond_vector: nn.Parameter | None = nn.Parameter(torch.zeros(output_dim))
        elif uncond_type == "none":
            self.uncond_vector = None
        else:
            raise ValueError(f"conditioner {name!r}: unknown uncond_type {uncond_type!r}; use 'learned' or 'none'")
        self.project = _make_projection(projection, self.cond_dim, output_dim)

    def apply_cond(self, inputs: Any) -> torch.Tensor:
        """Turn the raw cond-dict value into ``[B, T, cond_dim]``."""
        raise NotImplementedError

    def _reference(self) -> torch.Tensor | None:
        """A tensor of this module whose device/dtype inputs should follow."""
        return next(iter(self.parameters()), None)

    def forward(self, inputs: Any = None) -> torch.Tensor:
        """``[B, T, d]`` for a given input; the learned unconditional vector as ``[1, 1, d]`` for ``None``."""
        if inputs is None:
            if self.uncond_vector is None:
                raise ZonosInputError(
                    f"conditioner {self.name!r} has no unconditional vector, so its input is required"
                )
            # Already in model space: the projection is not applied.
            return self.uncond_vector.view(1, 1, -1)
        return self.project(self.apply_cond(inputs))

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


class EspeakPhonemeConditioner(Conditioner):
    """Text -> phoneme ids -> embeddings: one d-dim token per phoneme code point, plus BOS and EOS.

    Input: ``(texts, languages)`` (lists of equal length, or one language for all), phonemised here with
    eSpeak-NG; or an int64 tensor ``[B, L]`` of ids from :func:`~zonos.conditioning.tokenize_phonemes` when the
    caller has phonemised already. Output ``[B, L, d]``, left-padded rows embedded with the PAD row.
    """

    def __init__(self, output_dim: int, name: str = "espeak", **kwargs: Any) -> None:
        super().__init__(output_dim, name, **kwargs)
        self.phoneme_embedder = nn.Embedding(VOCAB_SIZE, output_dim)

    def apply_cond(self, inputs: Any) -> torch.Tensor:
        device = self.phoneme_embedder.weight.device
        if isinstance(inputs, torch.Tensor):
            if inputs.is_floating_point() or inputs.is_complex() or inputs.dtype == torch.bool or inputs.dim() > 2:
                raise ZonosInputError(
                    f"conditioner {self.name!r} takes phoneme ids as an integer tensor [B, L], got {inputs.dtype} "
                    f"of shape {tuple(inputs.shape)}"
                )
            ids = inputs if inputs.dim() == 2 else inputs.reshape(1, -1)  # [L] -> [1, L]
            if ids.shape[-1] == 0 or int(ids.min()) < 0 or int(ids.max()) >= VOCAB_SIZE:
                raise ZonosInputError(
                    f"conditioner {self.name!r} takes a non-empty tensor of phoneme ids in 0..{VOCAB_SIZE - 1} "
                    "(from zonos.conditioning.tokenize_phonemes)"
                )
        elif isinstance(inputs, str):  # a bare string would unpack into characters
            raise ZonosInputError(
                f"conditioner {self.name!r} expects (texts, languages), e.g. (['Hello.'], ['en-us']), not a string"
            )
        else:
            try:
                texts, languages = inputs
            except (TypeError, ValueError):
                raise ZonosInputError(
                    f"conditioner {self.name!r} expects (texts, languages), e.g. (['Hello.'], ['en-us']), "
                    f"or a tensor of phoneme ids; got {type(inputs).__name__}"
                ) from None
            phonemes = phonemize(texts, languages)
            languages = list(languages) * (len(phonemes) if len(languages) == 1 else 1)
            for text, language, p in zip(texts, languages, phonemes):
                check_phonemes(text, language, p)
            ids, _ = tokenize_phonemes(phonemes)
        return self.phoneme_embedder(ids.to(device=device, dtype=torch.long))


class PassthroughConditioner(Conditioner):
    """A ``cond_dim``-value vector used as is, then projected (the speaker embedding: 128 -> d, linear)."""

    def apply_cond(self, inputs: Any) -> torch.Tensor:
        ref = self._reference()
        x = _features(inputs, self.cond_dim, self.name, ref.device if ref is not None else torch.device("cpu"))
        # e.g. a bf16 speaker embedding fed to an fp32 model: follow the module's dtype.
        return x.to(ref.dtype) if ref is not None else x


class FourierConditioner(Conditioner):
    """Random Fourier features of k scalars: with x̂ = (x - min_val) / (max_val - min_val) and f = 2π x̂ Wᵀ,
    the output is [cos f, sin f] (all d/2 cosines, then the d/2 sines).

    ``weight`` [d/2, k] is a persistent *buffer* (std · N(0, 1) at init); the real values come from the checkpoint.
    x̂ is computed in float32 and cast to the buffer's dtype before the product, so a bf16 model computes the
    features in bf16, exactly like the reference implementation.
    """

    def __init__(
        self,
        output_dim: int,
        name: str,
        input_dim: int = 1,
        std: float = 1.0,
        min_val: float = 0.0,
        max_val: float = 1.0,
        **kwargs: Any,
    ) -> None:
        if output_dim % 2:
            raise ValueError(f"FourierConditioner {name!r} needs an even output_dim, got {output_dim}")
        if max_val == min_val:
            raise ValueError(f"FourierConditioner {name!r}: min_val and max_val must differ")
        super().__init__(output_dim, name, **kwargs)
        self.input_dim, self.min_val, self.max_val, self.std = input_dim, min_val, max_val, std
        # in place: an out-of-place op on meta would run a Python kernel (zonos.utils.on_meta)
        self.register_buffer("weight", torch.randn(output_dim // 2, input_dim).mul_(std))

    def _reference(self) -> torch.Tensor:
        return self.weight

    def apply_cond(self, inputs: Any) -> torch.Tensor:
        x = _features(inputs, self.input_dim, self.name, self.weight.device).float()
        x_hat = (x - self.min_val) / (self.max_val - self.min_val)  # no clamping: out-of-range is allowed
        f = (2 * math.pi * x_hat.to(self.weight.dtype)) @ self.weight.T
        return torch.cat([f.cos(), f.sin()], dim=-1)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, input_dim={self.input_dim}, min_val={self.min_val}, max_val={self.max_val}"


class IntegerConditioner(Conditioner):
    """An integer in [min_val, max_val] looked up in ``int_embedder`` (row = value - min_val)."""

    def __init__(self, output_dim: int, name: str, min_val: int = 0, max_val: int = 512, **kwargs: Any) -> None:
        if max_val < min_val:
            raise ValueError(f"IntegerConditioner {name!r}: max_val must be >= min_val")
        super().__init__(output_dim, name, **kwargs)
        self.min_val, self.max_val = int(min_val), int(max_val)
        self.int_embedder = nn.Embedding(self.max_val - self.min_val + 1, output_dim)

    def apply_cond(self, inputs: Any) -> torch.Tensor:
        x = _features(inputs, 1, self.name, self.int_embedder.weight.device).squeeze(-1)
        if x.is_floating_point() and bool((x != x.round()).any()):
            raise ZonosInputError(f"conditioner {self.name!r} takes integers, got {x.flatten().tolist()[:8]}")
        if x.is_floating_point() and bool((x.abs() > 2**31).any()):  # .long() of a huge float is undefined
            raise ZonosInputError(f"conditioner {self.name!r} takes integers in [{self.min_val}, {self.max_val}]")
        x = x.long()
        # An embedding index error would not say which conditioner or range; check first (one tiny sync).
        if bool(((x < self.min_val) | (x > self.max_val)).any()):
            raise ZonosInputError(
                f"conditioner {self.name!r} takes integers in [{self.min_val}, {self.max_val}], got {x.tolist()}"
            )
        return self.int_embedder(x - self.min_val)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, min_val={self.min_val}, max_val={self.max_val}"


CONDITIONER_TYPES: dict[str, type[Conditioner]] = {
    "EspeakPhonemeConditioner": EspeakPhonemeConditioner,
    "PassthroughConditioner": PassthroughConditioner,
    "FourierConditioner": FourierConditioner,
    "IntegerConditioner": IntegerConditioner,
}


def build_conditioners(configs: Sequence[Mapping[str, Any]], output_dim: int) -> list[Conditioner]:
    """Instantiate conditioners from the config's list of dicts (each has ``type`` and ``name``)."""
    out: list[Conditioner] = []
    for i, cfg in enumerate(configs):
        where = f"prefix_conditioner.conditioners[{i}]"
        if not isinstance(cfg, Mapping):
            raise CheckpointError(f"{where} must be a JSON object, got {type(cfg).__name__}")
        cfg = dict(cfg)
        kind = cfg.pop("type", None)
        if not isinstance(kind, str) or kind not in CONDITIONER_TYPES:
            raise CheckpointError(f"{where} has type {kind!r}; known types: {sorted(CONDITIONER_TYPES)}")
        if not isinstance(cfg.get("name"), str):
            raise CheckpointError(f"{where} ({kind}) needs a string 'name'")
        for key, value in cfg.items():  # everything but the names below is a number
            if key not in ("name", "projection", "uncond_type") and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            ):
                raise CheckpointError(f"{where} ({kind} {cfg['name']!r}): {key} must be a finite number, got {value!r}")
        try:
            out.append(CONDITIONER_TYPES[kind](output_dim, **cfg))
        except (TypeError, ValueError) as e:  # an unexpected key, or a value the module refuses
            raise CheckpointError(f"{where} ({kind} {cfg['name']!r}): {e}") from None
    return out


class PrefixConditioner(nn.Module):
    """All conditioners of a model: their outputs concatenated in config order, projected and normalised.

    Args:
        config: the ``prefix_conditioner`` section (a :class:`~zonos.config.PrefixConditionerConfig` or its dict).
        output_dim: model width d (2048 for the released models).

    Submodules (checkpoint names under ``prefix_conditioner.``): ``project`` (Linear d->d with bias for
    ``projection: "linear"``; identity for ``"none"``), ``conditioners`` (ModuleList in config order), ``norm``
    (LayerNorm(d), eps 1e-5).
    """

    def __init__(self, config: PrefixConditionerConfig | Mapping[str, Any], output_dim: int) -> None:
        super().__init__()
        if isinstance(config, Mapping):
            try:
                config = PrefixConditionerConfig(**config)
            except TypeError as e:
                raise CheckpointError(f"prefix_conditioner: {e}") from None
        self.output_dim = output_dim
        # Registered before ``conditioners`` so that state_dict() lists keys in the checkpoint's order.
        self.project = _make_projection(config.projection, output_dim, output_dim)
        self.conditioners = nn.ModuleList(build_conditioners(config.conditioners, output_dim))
        self.norm = nn.LayerNorm(output_dim, eps=1e-5)
        names = [c.name for c in self.conditioners]
        if len(set(names)) != len(names):
            raise CheckpointError(f"conditioner names must be unique, got {names}")

    @property
    def names(self) -> list[str]:
        """Cond-dict keys in prefix order."""
        return [c.name for c in self.conditioners]

    @property
    def required_keys(self) -> frozenset[str]:
        """Keys that must be present (no learned unconditional vector): ``{"espeak"}`` for the released models."""
        return frozenset(c.name for c in self.conditioners if c.uncond_vector is None)

    def prefix_length(self, num_phoneme_ids: int) -> int:
        """Prefix length for a text of ``num_phoneme_ids`` ids (BOS/EOS included): one token per other
        conditioner (L + 10 for the hybrid, L + 6 for the transformer)."""
        others = sum(1 for c in self.conditioners if not isinstance(c, EspeakPhonemeConditioner))
        return num_phoneme_ids + others

    def forward(self, cond_dict: Mapping[str, Any]) -> torch.Tensor:
        """Build the prefix ``[B, L, d]`` from a cond dict (see :func:`make_cond_dict`).

        Missing or ``None`` keys select learned unconditional vectors; keys no conditioner reads are ignored
        (the transformer model has no ``vqscore_8``/``ctc_loss``/``dnsmos_ovrl``/``speaker_noised``).
        Outputs with batch 1 are broadcast to the largest batch.
        """
        if not isinstance(cond_dict, Mapping):
            raise ZonosInputError(
                f"cond_dict must be a dict from zonos.conditioning.make_cond_dict, got {type(cond_dict).__name__}"
            )
        present = {k for k, v in cond_dict.items() if v is not None}
        missing = self.required_keys - present
        if missing:
            raise ZonosInputError(
                f"cond_dict lacks required key(s) {sorted(missing)}; build it with "
                "zonos.conditioning.make_cond_dict(text=..., language=...)"
            )
        outs = [c(cond_dict.get(c.name)) for c in self.conditioners]
        batch = max(o.shape[0] for o in outs)
        bad = {c.name: o.shape[0] for c, o in zip(self.conditioners, outs) if o.shape[0] not in (1, batch)}
        if bad:
            raise ZonosInputError(f"conditioner batch sizes must be 1 or {batch}; got {bad}")
        # Mixed dtypes only arise from odd inputs; follow the projection (or norm) dtype.
        ref = next(iter(self.project.parameters()), self.norm.weight)
        x = torch.cat([o.to(ref.dtype).expand(batch, -1, -1) for o in outs], dim=1)
        prefix = self.norm(self.project(x))
        # Finite inputs can still overflow here (a speaker embedding of 1e30 squares past float32 in the norm);
        # a NaN prefix would make generation emit silent all-zero codes, so refuse it now (one host read).
        if not bool(prefix.isfinite().all()):
            bad = [c.name for c, o in zip(self.conditioners, outs) if not bool(o.isfinite().all())]
            raise ZonosInputError(
                "the conditioning prefix came out NaN or infinite"
                + (f" in conditioner(s) {bad}" if bad else "")
                + "; an input is far outside its usual range (check the speaker embedding and the numeric values "
                "passed to make_cond_dict), or the model's weights are broken"
            )
        return prefix


# --- make_cond_dict -------------------------------------------------------------------------------------------

COND_KEYS: tuple[str, ...] = (
    "espeak",
    "speaker",
    "emotion",
    "fmax",
    "pitch_std",
    "speaking_rate",
    "language_id",
    "vqscore_8",
    "ctc_loss",
    "dnsmos_ovrl",
    "speaker_noised",
)
DEFAULT_TEXT = "It would be nice to have time for testing, indeed."
# Happiness, Sadness, Disgust, Fear, Surprise, Anger, Other, Neutral
DEFAULT_EMOTION: tuple[float, ...] = (0.3077, 0.0256, 0.0256, 0.0256, 0.0256, 0.0256, 0.2564, 0.3077)
DEFAULT_UNCONDITIONAL_KEYS: frozenset[str] = frozenset({"vqscore_8", "dnsmos_ovrl"})


def _vector(value: Any, n: int, key: str, hint: str = "", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A vector of exactly n finite real values from a number/list/tuple/array/tensor (bools, strings and complex
    values refused; tensors and lists of them alike)."""
    what = "a single number" if n == 1 else f"{n} numbers ({hint})"
    if n == 1 and not isinstance(value, (torch.Tensor, Sequence)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ZonosInputError(f"{key} must be a single number, got {value!r} ({type(value).__name__})")
        try:
            x = float(value)
        except OverflowError:  # an int past float's range (10**400)
            x = math.inf
        t = torch.tensor([x], dtype=dtype)
        if not bool(t.isfinite().all()):  # NaN, inf, or past the dtype's range (1e39 in float32)
            raise ZonosInputError(f"{key} must be finite (within {dtype}'s range), got {value}")
        return t
    if isinstance(value, (str, bytes)) or (
        isinstance(value, Sequence) and any(isinstance(v, (str, bytes, bool)) for v in value)
    ):
        raise ZonosInputError(f"{key} must be {what}, got {value!r}")
    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise ZonosInputError(f"{key} must be {what}, got {str(value)[:60]} ({e})") from None
    if t.dtype == torch.bool or t.is_complex():
        raise ZonosInputError(f"{key} must be {what} (real numbers), got a {t.dtype} tensor")
    t = t.detach().to("cpu", dtype).reshape(-1)
    if t.numel() != n:
        raise ZonosInputError(f"{key} must be {what}, got {t.numel()} values")
    if not bool(t.isfinite().all()):
        raise ZonosInputError(f"{key} must be finite, got {t.tolist()}")
    return t


def _unconditional_keys(keys: Any) -> frozenset[str]:
    """The checked key names of ``make_cond_dict``'s ``unconditional_keys``: one name, or a list, tuple, set or
    other iterable of names (``None``: none)."""
    valid = ", ".join(COND_KEYS[1:])
    if keys is None:
        return frozenset()
    if isinstance(keys, str):
        keys = (keys,)
    wrong = ZonosInputError(
        f"unconditional_keys must be a list of key names (or one name), got {type(keys).__name__} "
        f"{str(keys)[:60]}; pass e.g. ['vqscore_8', 'dnsmos_ovrl'] (valid keys: {valid})"
    )
    if isinstance(keys, (bytes, Mapping)) or not isinstance(keys, Iterable):  # a dict's values would be ignored
        raise wrong
    try:
        keys = list(keys)
    except TypeError:  # iterable in type only, e.g. a 0-d tensor
        raise wrong from None
    bad = [k for k in keys if not isinstance(k, str)]
    if bad:
        raise ZonosInputError(
            f"unconditional_keys must hold key names (strings), got {bad[0]!r} ({type(bad[0]).__name__}); "
            f"valid keys are {valid}"
        )
    if "espeak" in keys:
        raise ZonosInputError(
            "'espeak' (the text) cannot be unconditional: it has no learned unconditional vector; remove it from "
            "unconditional_keys"
        )
    unknown = sorted(set(keys) - set(COND_KEYS))
    if unknown:
        raise ZonosInputError(f"unknown unconditional key(s) {unknown}; valid keys are {valid}")
    return frozenset(keys)


def make_cond_dict(
    text: str = DEFAULT_TEXT,
    language: str = "en-us",
    speaker: torch.Tensor | Sequence[float] | None = None,
    emotion: Sequence[float] | torch.Tensor = DEFAULT_EMOTION,
    fmax: float = 22050.0,
    pitch_std: float = 20.0,
    speaking_rate: float = 15.0,
    vqscore_8: Sequence[float] | torch.Tensor = (0.78,) * 8,
    ctc_loss: float = 0.0,
    dnsmos_ovrl: float = 4.0,
    speaker_noised: bool = False,
    unconditional_keys: Iterable[str] = DEFAULT_UNCONDITIONAL_KEYS,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """Build the cond dict that :class:`PrefixConditioner` (and generation) consumes.

    Args:
        text: text to speak (non-empty).
        language: one of :data:`supported_language_codes` (case-insensitive); also the eSpeak voice.
        speaker: 128-value speaker embedding (from the speaker model); ``None`` uses the learned unconditional
            vector. A tensor keeps its dtype (e.g. bf16).
        emotion: 8 weights (Happiness, Sadness, Disgust, Fear, Surprise, Anger, Other, Neutral), nominally 0..1;
            divided by their sum.
        fmax: maximum frequency in Hz (0..24000; 22050 recommended for voice cloning).
        pitch_std: pitch standard deviation (0..400; 20-45 normal, 60-150 expressive).
        speaking_rate: speaking rate (0..40; 10 slow, 30 very fast).
        vqscore_8: 8 VQScore targets (0.5..0.8), hybrid only.
        ctc_loss: target CTC loss (-1..1000; use 0 or 1), hybrid only.
        dnsmos_ovrl: DNSMOS overall target (1..5), hybrid only.
        speaker_noised: whether the speaker embedding is noisy, hybrid only.
        unconditional_keys: keys dropped from the result so their learned unconditional vectors are used
            (a single key may be given as a plain string). ``None`` for a value has the same effect; any other
            value of a dropped key is still checked.
        device: where the tensors go; ``None`` means CUDA if available, else CPU.

    Returns:
        ``{"espeak": ([text], [language]), "speaker": [1,1,128] | None, "emotion": [1,1,8] float32, ...,
        "language_id": [1,1,1] int64, "speaker_noised": [1,1,1] int64}``. Ranges are not enforced (they only
        set the Fourier normalisation).

    Raises:
        ZonosInputError: empty text, text that phonemises to no sound or holds a lone surrogate, unknown language
            (with suggestions), wrong number of emotion/speaker/vqscore values, a bool or string where a number
            is meant, NaN or infinite values (of unconditional keys too), negative or all-zero emotion weights,
            unconditional_keys that is not a list of known key names, or a device this machine does not have.
            Japanese text without the ``ja`` extra raises :class:`~zonos.conditioning.MissingDependencyError`
            (also a ZonosInputError).
    """
    check_text(text)
    language = normalize_language(language)

    drop = _unconditional_keys(unconditional_keys)
    dev = check_device("device", device) if device is not None else default_device()

    # Every value is checked, also those of the keys dropped below: a NaN or a wrong length is the caller's
    # mistake even where the value goes unused (vqscore_8 and dnsmos_ovrl are dropped by default).
    out: dict[str, Any] = {"espeak": ([text], [language])}

    if speaker is not None:
        if isinstance(speaker, torch.Tensor):
            if speaker.numel() != 128:
                raise ZonosInputError(
                    f"speaker must hold 128 values (the speaker-embedding model's output), got shape "
                    f"{tuple(speaker.shape)}; pass speaker=None for no speaker conditioning"
                )
            if not speaker.is_floating_point():
                raise ZonosInputError(
                    f"speaker must be a floating-point embedding (from make_speaker_embedding), got {speaker.dtype}"
                )
            check_finite("speaker", speaker, "recompute it with model.make_speaker_embedding(wav, sr)")
            out["speaker"] = speaker.reshape(1, 1, 128)
        else:
            out["speaker"] = _vector(speaker, 128, "speaker", "the speaker-embedding model's output").view(1, 1, 128)
    else:
        out["speaker"] = None  # explicit None: the learned unconditional speaker vector

    if emotion is not None:
        labels = "Happiness, Sadness, Disgust, Fear, Surprise, Anger, Other, Neutral"
        # float64, so that weights near the float32 limit (e.g. [3e38] * 8) do not overflow when summed
        e = _vector(emotion, 8, "emotion", labels, dtype=torch.float64)
        if bool((e < 0).any()):
            raise ZonosInputError(f"emotion weights must be >= 0 ({labels}), got {e.tolist()}")
        total = float(e.sum())
        if total <= 0.0:
            raise ZonosInputError("emotion values sum to 0; give at least one non-zero weight (e.g. Neutral = 1)")
        out["emotion"] = (e / total).float().view(1, 1, 8)  # the model always sees weights summing to 1

    for key, value in (("fmax", fmax), ("pitch_std", pitch_std), ("speaking_rate", speaking_rate)):
        if value is not None:
            out[key] = _vector(value, 1, key).view(1, 1, 1)

    out["language_id"] = torch.tensor([[[language_id(language)]]], dtype=torch.long)

    if vqscore_8 is not None:
        out["vqscore_8"] = _vector(vqscore_8, 8, "vqscore_8", "one VQScore per eighth of the audio").view(1, 1, 8)
    for key, value in (("ctc_loss", ctc_loss), ("dnsmos_ovrl", dnsmos_ovrl)):
        if value is not None:
            out[key] = _vector(value, 1, key).view(1, 1, 1)
    if speaker_noised is not None:
        if not isinstance(speaker_noised, (bool, int)) or speaker_noised not in (0, 1):
            raise ZonosInputError(f"speaker_noised must be True or False, got {speaker_noised!r}")
        out["speaker_noised"] = torch.tensor([[[int(speaker_noised)]]], dtype=torch.long)

    # Last, as the one step that costs milliseconds: refuse text that phonemises to no sound ('\u200b', '<>').
    # The result is cached, so the conditioner does not phonemise it again.
    check_phonemes(text, language, phonemize([text], [language])[0])
    return {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in out.items() if k not in drop}
