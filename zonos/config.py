"""Model configuration, read from (and written back to) the published ``config.json`` layout."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

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
            raise ValueError(f"ssm_cfg has keys this implementation does not know: {sorted(unknown)}")
        if self.ssm_cfg.get("layer", "Mamba2") != "Mamba2":
            raise ValueError(f"ssm_cfg.layer={self.ssm_cfg['layer']!r} is not supported; only 'Mamba2' is")
        return {**MAMBA2_DEFAULTS, **{k: v for k, v in self.ssm_cfg.items() if k != "layer"}}

    def attention(self) -> dict[str, Any]:
        """The attention settings with mamba_ssm's defaults filled in and derived sizes resolved."""
        unknown = set(self.attn_cfg) - set(ATTENTION_DEFAULTS)
        if unknown:
            raise ValueError(f"attn_cfg has keys this implementation does not know: {sorted(unknown)}")
        cfg = {**ATTENTION_DEFAULTS, **self.attn_cfg}
        cfg["num_heads_kv"] = cfg["num_heads_kv"] or cfg["num_heads"]
        cfg["head_dim"] = cfg["head_dim"] or self.d_model // cfg["num_heads"]
        if cfg["num_heads"] % cfg["num_heads_kv"]:
            raise ValueError("attn_cfg.num_heads must be a multiple of attn_cfg.num_heads_kv")
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
    def from_dict(cls, d: dict) -> ZonosConfig:
        """Build from the parsed ``config.json`` dict."""
        try:
            d = dict(d)
            backbone = BackboneConfig(**d.pop("backbone"))
            prefix = PrefixConditionerConfig(**d.pop("prefix_conditioner"))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a Zonos config.json (expected 'backbone' and 'prefix_conditioner'): {e}") from e
        return cls(backbone=backbone, prefix_conditioner=prefix, **d)

    @classmethod
    def from_json(cls, path: str | Path) -> ZonosConfig:
        """Read a ``config.json`` file."""
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def to_dict(self) -> dict:
        """The ``config.json`` dict (inverse of :meth:`from_dict`)."""
        return asdict(self)
