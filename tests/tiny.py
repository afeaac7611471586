"""Tiny random Zonos checkpoints for CPU tests: the real configs' structure at toy widths."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from zonos.codec.autoencoder import DACAutoencoder
from zonos.codec.dac import DAC, DACConfig

DATA = Path(__file__).parent / "data"

# A DAC with the real strides (hop 512, the same receptive field) and toy widths.
TINY_DAC = dict(encoder_hidden_size=4, decoder_hidden_size=32, hidden_size=64)


def real_config(kind: str) -> dict:
    """The published config.json of ``hybrid`` or ``transformer``."""
    return json.loads((DATA / f"zonos-v0.1-{kind}_config.json").read_text())


def tiny_config(kind: str) -> dict:
    """The published config with small widths: 4 hybrid layers (attention at 0 and 2) or 2 transformer layers."""
    cfg = real_config(kind)
    bb = cfg["backbone"]
    bb.update(d_model=64, attn_mlp_d_intermediate=96)
    bb["attn_cfg"].update(num_heads=4, num_heads_kv=2, rotary_emb_dim=16)
    if kind == "hybrid":
        bb.update(n_layer=4, attn_layer_idx=[0, 2])
        bb["ssm_cfg"].update(d_state=16, headdim=16, chunk_size=8)
    else:
        bb.update(n_layer=2, attn_layer_idx=[0, 1])
    return cfg


def random_state_dict(model: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values for every tensor of ``model``'s state dict, scaled so activations stay O(1)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in model.state_dict().items():
        if name.endswith(("A_log", "dt_bias")):
            out[name] = t.detach().clone()  # keep the mixer's sensible decay/step ranges
            continue
        fan_in = t.shape[-1] if t.ndim >= 2 else 1
        scale = 1.0 if (t.ndim == 1 or "embed" in name or "uncond" in name) else fan_in**-0.5
        if name.endswith(("norm.weight", "norm2.weight", "norm_f.weight")):
            out[name] = 1 + 0.1 * torch.randn(t.shape, generator=gen)
        else:
            out[name] = scale * torch.randn(t.shape, generator=gen)
    return out


def random_dac_weights(config: DACConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded weights with roughly unit-scale activations, Snake alphas spread over [0.3, 2], and a
    small final conv so tanh does not saturate (a saturated output would hide errors)."""
    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in DAC(config).state_dict().items()}
    out = {}
    for name, shape in shapes.items():
        if name.endswith("alpha"):
            t = 0.3 + 1.7 * torch.rand(shape, generator=g)
        elif name.endswith("codebook.weight"):
            t = torch.randn(shape, generator=g)
        elif name.endswith("bias"):
            t = 0.05 * torch.randn(shape, generator=g)
        else:
            fan_in = shape[0] * 2 if ".conv_t1." in name else shape[1] * shape[2]
            t = torch.randn(shape, generator=g) / math.sqrt(fan_in)
            if ".res_unit" in name and ".conv2." in name:
                t *= 0.2  # residual branches stay small, so the signal does not grow block by block
        out[name] = t
    out["decoder.conv2.weight"] *= 0.1
    return out


def tiny_codec(device: str = "cpu") -> DACAutoencoder:
    """A seeded random DAC of :data:`TINY_DAC` size."""
    torch.manual_seed(0)
    return DACAutoencoder(DACConfig(**TINY_DAC), device=device)


def save_tiny_checkpoint(directory: Path, kind: str, seed: int = 0, mutate=None) -> tuple[Path, Path]:
    """Write ``config.json`` and a bf16 ``model.safetensors`` of random weights for the tiny ``kind`` model;
    ``mutate(state)`` may damage the state dict first. Returns both paths."""
    from zonos.config import ZonosConfig
    from zonos.model import Zonos

    cfg = tiny_config(kind)
    with torch.device("meta"):
        skeleton = Zonos(ZonosConfig.from_dict(cfg))
    torch.manual_seed(seed)
    state = random_state_dict(Zonos(ZonosConfig.from_dict(cfg)), seed)
    assert set(state) == set(skeleton.state_dict())
    if mutate:
        mutate(state)
    (directory / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    return directory / "config.json", directory / "model.safetensors"


def tiny_model(directory: Path, kind: str = "hybrid", device: str = "cpu", **kwargs):
    """The tiny ``kind`` model saved to ``directory`` and loaded back through ``Zonos.from_local``, with a
    tiny codec and a short ``max_seqlen``."""
    from zonos.model import Zonos

    kwargs.setdefault("max_seqlen", 256)
    return Zonos.from_local(
        *save_tiny_checkpoint(directory, kind), device=device, autoencoder=tiny_codec(device), **kwargs
    )
