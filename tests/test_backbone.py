"""Backbone invariants: checkpoint layout at real size, and prefill/decode cache consistency."""

import pytest
import torch

from tests.tiny import DATA, random_state_dict, real_config, tiny_config
from zonos.backbone import ZonosBackbone
from zonos.config import ZonosConfig


def _tsv(kind):
    rows = (DATA / f"zonos-v0.1-{kind}_state_dict.tsv").read_text().splitlines()[1:]
    return {name: shape for name, shape, _ in (r.split("\t") for r in rows)}


@pytest.mark.parametrize("kind", ["hybrid", "transformer"])
def test_real_size_names_and_shapes(kind):
    from zonos.model import Zonos

    with torch.device("meta"):
        model = Zonos(ZonosConfig.from_dict(real_config(kind)))
    ours = {k: "x".join(map(str, v.shape)) or "scalar" for k, v in model.state_dict().items()}
    assert ours == _tsv(kind)


def _backbone(kind, seed=0):
    torch.manual_seed(seed)
    bb = ZonosBackbone(ZonosConfig.from_dict(tiny_config(kind)).backbone)
    bb.load_state_dict(random_state_dict(bb, seed))
    return bb.double().eval()


@pytest.mark.parametrize("kind", ["hybrid", "transformer"])
@pytest.mark.parametrize("n,k", [(21, 13), (21, 1), (30, 8)])
def test_prefill_then_steps_equals_full_prefill(kind, n, k):
    bb = _backbone(kind)
    x = torch.randn(2, n, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(n + k))
    full = bb(x, bb.allocate_inference_state(2, 64))
    state = bb.allocate_inference_state(2, 64)
    outs = [bb(x[:, :k], state)]
    for t in range(k, n):
        outs.append(bb.step(x[:, t : t + 1], state))
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-9, atol=1e-9)
    assert state.seqlen == n and int(state.position) == n


@pytest.mark.parametrize("kind", ["hybrid", "transformer"])
def test_prefill_in_pieces_equals_one_prefill(kind):
    """Prefill continued from a cache (conv context, SSM initial state, KV offset) equals one prefill."""
    bb = _backbone(kind, seed=1)
    x = torch.randn(1, 29, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    full = bb(x, bb.allocate_inference_state(1, 32))
    state = bb.allocate_inference_state(1, 32)
    pieces = [bb(x[:, a:b], state) for a, b in ((0, 2), (2, 11), (11, 29))]
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-9, atol=1e-9)


def test_fp32_tolerance_and_overflow_error():
    bb = _backbone("hybrid").float()
    x = torch.randn(2, 17, 64)
    full = bb(x, bb.allocate_inference_state(2, 17))
    state = bb.allocate_inference_state(2, 17)
    bb(x[:, :16], state)
    last = bb.step(x[:, 16:], state)
    torch.testing.assert_close(last[:, 0], full[:, -1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="exceed the inference state's maximum"):
        bb.step(x[:, :1], state)


def test_rotary_pairing_differs_between_backbones():
    """The hybrid rotates half-split pairs, the transformer interleaved pairs (the published configs say so)."""
    hybrid = ZonosConfig.from_dict(real_config("hybrid")).backbone.attention()
    transformer = ZonosConfig.from_dict(real_config("transformer")).backbone.attention()
    assert hybrid["rotary_emb_interleaved"] is False and transformer["rotary_emb_interleaved"] is True
    from zonos.ops import apply_rotary, rotary_cos_sin

    x = torch.randn(1, 3, 1, 8, dtype=torch.float64)
    cos, sin = rotary_cos_sin(torch.arange(3), 8, 10000.0, torch.float64)
    half = apply_rotary(x, cos, sin, interleaved=False)
    inter = apply_rotary(x, cos, sin, interleaved=True)
    # Position 1, first frequency: half-split rotates channels (0, 4), interleaved rotates (0, 1).
    c, s = cos[1, 0], sin[1, 0]
    torch.testing.assert_close(half[0, 1, 0, 0], x[0, 1, 0, 0] * c - x[0, 1, 0, 4] * s)
    torch.testing.assert_close(inter[0, 1, 0, 0], x[0, 1, 0, 0] * c - x[0, 1, 0, 1] * s)
