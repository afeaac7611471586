"""Model configuration, read from (and written back to) the published ``config.json`` layout."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from zonos.codebook_pattern import CODEBOOK_SIZE
from zonos.errors import CheckpointError, ZonosInputError
from zonos.utils import on_meta
from zonos.validation import check_int, check_real

# Upper bounds on a config's sizes, far past any Zonos checkpoint (d_model 2048, 46 layers), so that a damaged or
# hostile config.json is refused before building its model: 10000 layers took 27 s and 450 MB on the meta device,
# a chunk_size or rotary dim of 1e9 loaded and then asked for a terabyte at the first generate.
MAX_WIDTH = 1 << 16
MAX_LAYERS = 1024

# mamba_ssm's Mamba2 defaults; a config's ``ssm_cfg`` overrides any of them.
MAMBA2_DEFAULTS: dict[str, Any] = {
    "d_state": 128,
    "d_conv": 4,
    "expand": 2,
    "headdim": 64,
    "ngroups": 1,
    "chunk_size": 256,
}

# mamba_ssm's MHA defaults; a config's ``attn_cfg`` overrides any of them.
ATTENTION_DEFAULTS: dict[str, Any] = {
    "num_heads": 16,
    "num_heads_kv": None,  # None means num_heads (no grouping)
    "head_dim": None,  # None means d_model // num_heads
    "rotary_emb_dim": 0,
    "rotary_emb_base": 10000.0,
    "rotary_emb_interleaved": False,
    "qkv_proj_bias": True,
    "out_proj_bias": True,
    "causal": True,
}


@dataclass
class BackboneConfig:
    """The backbone section of ``config.json``: layer count, widths and per-kind mixer settings."""

    d_model: int = 1024
    d_intermediate: int = 0
    attn_mlp_d_intermediate: int = 0
    n_layer: int = 16
    ssm_cfg: dict = field(default_factory=dict)
    attn_layer_idx: list = field(default_factory=list)
    attn_cfg: dict = field(default_factory=dict)
    rms_norm: bool = False
    residual_in_fp32: bool = False
    norm_epsilon: float = 1e-5

    @property
    def is_hybrid(self) -> bool:
        """True when some layers are Mamba2 (a non-empty ``ssm_cfg``), False for a pure transformer."""
        return bool(self.ssm_cfg)

    def mamba2(self) -> dict[str, Any]:
        """The Mamba2 settings with mamba_ssm's defaults filled in."""
        unknown = set(self.ssm_cfg) - set(MAMBA2_DEFAULTS) - {"layer"}
        if unknown:
            raise CheckpointError(f"backbone.ssm_cfg has keys this implementation does not know: {sorted(unknown)}")
        if self.ssm_cfg.get("layer", "Mamba2") != "Mamba2":
            raise CheckpointError(
                f"backbone.ssm_cfg.layer={self.ssm_cfg['layer']!r} is not supported; only 'Mamba2' is"
            )
        return {**MAMBA2_DEFAULTS, **{k: v for k, v in self.ssm_cfg.items() if k != "layer"}}

    def attention(self) -> dict[str, Any]:
        """The attention settings with mamba_ssm's defaults filled in and derived sizes resolved."""
        unknown = set(self.attn_cfg) - set(ATTENTION_DEFAULTS)
        if unknown:
            raise CheckpointError(f"backbone.attn_cfg has keys this implementation does not know: {sorted(unknown)}")
        cfg = {**ATTENTION_DEFAULTS, **self.attn_cfg}
        cfg["num_heads_kv"] = cfg["num_heads_kv"] or cfg["num_heads"]
        with _as_config_error():
            for key in ("num_heads", "num_heads_kv"):
                check_int(f"backbone.attn_cfg.{key}", cfg[key], 1)
        cfg["head_dim"] = cfg["head_dim"] or self.d_model // cfg["num_heads"]
        if cfg["num_heads"] % cfg["num_heads_kv"]:
            raise CheckpointError("backbone.attn_cfg.num_heads must be a multiple of attn_cfg.num_heads_kv")
        return cfg


@dataclass
class PrefixConditionerConfig:
    """The ``prefix_conditioner`` section: one dict per conditioner, in prefix order."""

    conditioners: list[dict] = field(default_factory=list)
    projection: Literal["none", "linear", "mlp"] = "none"


@dataclass
class ZonosConfig:
    """A whole Zonos ``config.json``."""

    backbone: BackboneConfig
    prefix_conditioner: PrefixConditionerConfig
    eos_token_id: int = 1024
    masked_token_id: int = 1025
    # Optional in the published files; upstream defaults it to 8 (see ``Zonos`` head padding).
    pad_vocab_to_multiple_of: int = 8

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ZonosConfig:
        """Build from the parsed ``config.json`` dict, checking every key and value type.

        Raises :class:`~zonos.errors.CheckpointError` for a missing section, an unknown key or a wrongly typed
        value (a string ``eos_token_id``, a bool ``d_model``...), naming the key.
        """
        if not isinstance(d, Mapping):
            raise CheckpointError(f"not a Zonos config.json: expected a JSON object, got {type(d).__name__}")
        d = dict(d)
        missing = [k for k in ("backbone", "prefix_conditioner") if not isinstance(d.get(k), Mapping)]
        if missing:
            raise CheckpointError(
                f"not a Zonos config.json: {' and '.join(repr(k) for k in missing)} must be JSON object(s)"
            )
        backbone = _dataclass_from(BackboneConfig, d.pop("backbone"), "backbone")
        prefix = _dataclass_from(PrefixConditionerConfig, d.pop("prefix_conditioner"), "prefix_conditioner")
        config = _dataclass_from(cls, {**d, "backbone": backbone, "prefix_conditioner": prefix}, "config")
        config.validate()
        return config

    @classmethod
    def from_json(cls, path: str | Path) -> ZonosConfig:
        """Read a ``config.json`` file; any problem raises :class:`~zonos.errors.CheckpointError` naming it."""
        data = read_json(path, "a Zonos config.json")
        try:
            return cls.from_dict(data)
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from None

    def validate(self) -> None:
        """Check every value's type and range (what :meth:`from_dict` runs); raises CheckpointError."""
        bb = self.backbone
        with _as_config_error():
            check_int("backbone.d_model", bb.d_model, 1, MAX_WIDTH)
            check_int("backbone.d_intermediate", bb.d_intermediate, 0, MAX_WIDTH)
            check_int("backbone.attn_mlp_d_intermediate", bb.attn_mlp_d_intermediate, 0, MAX_WIDTH)
            check_int("backbone.n_layer", bb.n_layer, 1, MAX_LAYERS)
            check_real("backbone.norm_epsilon", bb.norm_epsilon, 0.0, 1.0, lo_open=True)
            for key in ("rms_norm", "residual_in_fp32"):
                if not isinstance(getattr(bb, key), bool):
                    raise ZonosInputError(f"backbone.{key} must be true or false, got {getattr(bb, key)!r}")
            for key in ("ssm_cfg", "attn_cfg"):
                if not isinstance(getattr(bb, key), Mapping):
                    raise ZonosInputError(f"backbone.{key} must be a JSON object, got {getattr(bb, key)!r}")
            if not isinstance(bb.attn_layer_idx, list):
                raise ZonosInputError(f"backbone.attn_layer_idx must be a list, got {bb.attn_layer_idx!r}")
            for i, layer in enumerate(bb.attn_layer_idx):
                check_int(f"backbone.attn_layer_idx[{i}]", layer, 0, bb.n_layer - 1)
            if bb.is_hybrid:
                for key, value in bb.mamba2().items():
                    check_int(f"backbone.ssm_cfg.{key}", value, 1, MAX_WIDTH)
            attn = bb.attention()
            for key in ("num_heads", "num_heads_kv", "head_dim"):
                check_int(f"backbone.attn_cfg.{key}", attn[key], 1, MAX_WIDTH)
            check_int("backbone.attn_cfg.rotary_emb_dim", attn["rotary_emb_dim"], 0, attn["head_dim"])
            check_real("backbone.attn_cfg.rotary_emb_base", attn["rotary_emb_base"], 0.0, lo_open=True)
            for key in ("rotary_emb_interleaved", "qkv_proj_bias", "out_proj_bias", "causal"):
                if not isinstance(attn[key], bool):
                    raise ZonosInputError(f"backbone.attn_cfg.{key} must be true or false, got {attn[key]!r}")
            pc = self.prefix_conditioner
            if pc.projection not in ("none", "linear", "mlp"):
                raise ZonosInputError(
                    f"prefix_conditioner.projection must be 'none', 'linear' or 'mlp', got {pc.projection!r}"
                )
            if not isinstance(pc.conditioners, list) or not all(isinstance(c, Mapping) for c in pc.conditioners):
                raise ZonosInputError("prefix_conditioner.conditioners must be a list of JSON objects")
        # Building the conditioners on the meta device checks their types and values without allocating.
        from zonos.conditioning.conditioners import build_conditioners  # lazily: conditioning imports this module

        with on_meta():
            build_conditioners(pc.conditioners, bb.d_model)
        with _as_config_error():
            eos = check_int("eos_token_id", self.eos_token_id, 0, CODEBOOK_SIZE)  # the heads' last column
            check_int("masked_token_id", self.masked_token_id, 0, CODEBOOK_SIZE + 1)  # the embeddings' last row
            check_int("pad_vocab_to_multiple_of", self.pad_vocab_to_multiple_of, 1)
            if self.masked_token_id == eos:
                raise ZonosInputError(f"masked_token_id and eos_token_id must differ, both are {eos}")

    def to_dict(self) -> dict:
        """The ``config.json`` dict (inverse of :meth:`from_dict`)."""
        return asdict(self)


@contextlib.contextmanager
def _as_config_error() -> Iterator[None]:
    """Turn a value check's ZonosInputError into the CheckpointError of a bad config file."""
    try:
        yield
    except CheckpointError:
        raise
    except ZonosInputError as e:
        raise CheckpointError(f"config: {e}") from None


def _dataclass_from(cls: type, values: Mapping[str, Any], section: str) -> Any:
    """``cls(**values)`` with unknown and missing keys reported by name (not as a bare TypeError)."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise CheckpointError(
            f"{section} has unknown key(s) {unknown}; known keys: {sorted(names)}. Is this the config.json of a "
            "Zonos model (e.g. Zyphra/Zonos-v0.1-hybrid)?"
        )
    try:
        return cls(**values)
    except TypeError as e:  # a required field is missing
        raise CheckpointError(f"{section}: {e}") from None


def read_json(path: str | os.PathLike, what: str) -> Any:
    """Parse a JSON file, raising :class:`~zonos.errors.CheckpointError` that names the file for a missing,
    unreadable or malformed one; later CheckpointErrors about its content get the file name prefixed by the
    callers (see :meth:`ZonosConfig.from_json`)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; expected {what}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(
            f"{path} is not valid JSON ({e}); expected {what}. If it was downloaded, download it again"
        ) from None
    except OSError as e:
        raise CheckpointError(f"could not read {path} ({e}); expected {what}") from None
