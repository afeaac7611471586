"""Backbone invariants: checkpoint layout at real size, and prefill/decode cache consistency."""

import copy

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
    assert state.seqlen == n and (state.position == n).all()


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


def _binary(length):
    return [1 << k for k in reversed(range(length.bit_length())) if length >> k & 1]


def _schedules(length):
    irregular, rest = [], length
    for n in [5, 1, 16, 3, 64, 2, 100]:
        if rest <= 0:
            break
        irregular.append(min(n, rest))
        rest -= irregular[-1]
    irregular += [rest] if rest > 0 else []
    return {"binary": _binary(length), "irregular": irregular}


def _caches(state):
    return [t for c in state.caches for t in ((c.k, c.v) if hasattr(c, "k") else (c.conv, c.ssm))]


@pytest.mark.parametrize("kind", ["hybrid", "transformer"])
@pytest.mark.parametrize("length", [1, 7, 64, 121, 300])
def test_prefill_in_fixed_size_pieces_equals_one_prefill(kind, length):
    """The graph runner's pieces (the device position advancing between them, conv context and SSD state
    taken from the cache, KV rows at the device position), and other schedules, equal one prefill and the
    token-by-token steps; the states they leave behind (caches, position, seqlen) are the same too."""
    bb = _backbone(kind, seed=2)
    x = torch.randn(2, length + 3, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(length))
    one = bb.allocate_inference_state(2, 320)
    full = bb(x[:, :length], one)
    longer = bb(x, bb.allocate_inference_state(2, 320))
    steps = bb.allocate_inference_state(2, 320)
    by_token = torch.cat([bb.step(x[:, t : t + 1], steps) for t in range(length)], 1)
    torch.testing.assert_close(by_token, full, rtol=1e-9, atol=1e-9)
    for name, pieces in _schedules(length).items():
        assert sum(pieces) == length, name
        state = bb.allocate_inference_state(2, 320)
        state.reset()  # reused state: zeroed caches are the start of a sequence
        outs, start = [], 0
        for n in pieces:
            outs.append(bb(x[:, start : start + n], state))
            start += n
        torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-9, atol=1e-9, msg=name)
        assert state.seqlen == length and (state.position == length).all()
        for a, b in zip(_caches(state), _caches(one)):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=name)
        # Decoding continues from the pieces' state as from one prefill.
        for t in range(length, length + 3):
            torch.testing.assert_close(bb.step(x[:, t : t + 1], state), longer[:, t : t + 1], msg=name)


def test_prefill_pieces_schedule():
    """Whole pieces of 256, then one padded to a multiple of 16: one piece up to 256 tokens, from 16 sizes."""
    from zonos.engine.engine import STAGING_ROOM
    from zonos_accel.graphs import MAX_PIECE, PIECE_SIZES, PIECE_STEP, padded_length, prefill_pieces

    assert len(PIECE_SIZES) == len(set(PIECE_SIZES)) == 16 and STAGING_ROOM >= PIECE_STEP
    assert prefill_pieces(121) == [128] and prefill_pieces(1001) == [256, 256, 256, 240]
    for length in range(1, 1100):
        pieces = prefill_pieces(length)
        assert sum(pieces) == padded_length(length) and 0 <= padded_length(length) - length < PIECE_STEP
        assert set(pieces) <= set(PIECE_SIZES) and len(pieces) == -(-length // MAX_PIECE)


def test_prefill_attention_reference():
    """Query i of a piece starting at ``position`` sees cache rows 0..position + i; one token is decode_attention."""
    from zonos import ops

    gen = torch.Generator().manual_seed(0)
    b, n, hq, hkv, d, rows, position = 2, 5, 4, 2, 8, 20, 7
    q = torch.randn(b, n, hq, d, dtype=torch.float64, generator=gen)
    k, v = (torch.randn(b, rows, hkv, d, dtype=torch.float64, generator=gen) for _ in range(2))
    out = ops.prefill_attention(q, k, v, torch.tensor(position))
    for i in range(n):
        kk, vv = (t[:, : position + i + 1].repeat_interleave(hq // hkv, dim=2) for t in (k, v))
        scores = torch.einsum("bhd,bshd->bhs", q[:, i], kk) / d**0.5
        expected = torch.einsum("bhs,bshd->bhd", scores.softmax(-1), vv)
        torch.testing.assert_close(out[:, i], expected, rtol=1e-12, atol=1e-12)
    one = ops.prefill_attention(q[:, :1], k, v, torch.tensor(position))
    torch.testing.assert_close(one, ops.decode_attention(q[:, :1], k, v, torch.tensor(position)))


def test_decay_rates_are_derived_once():
    """Mamba2's A = -exp(A_log) is kept (not recomputed per call) outside the state dict, and equals the
    per-call computation it replaced after loads, casts and moves."""
    from zonos.backbone.mamba2 import Mamba2Mixer
    from zonos.ops import compute_dtype

    def expected(m):
        return -torch.exp(m.A_log.to(compute_dtype(m.A_log.dtype)))  # what _dt_A and step computed before

    bb = _backbone("hybrid")  # loaded with load_state_dict, then cast to float64
    mixers = [layer.mixer for layer in bb.layers if isinstance(layer.mixer, Mamba2Mixer)]
    assert mixers and not any(k.endswith(".A") for k in bb.state_dict()) and "A" not in dict(mixers[0].named_buffers())
    for m in mixers:
        assert m.A.dtype == torch.float64 and torch.equal(m.A, expected(m))
    m = copy.deepcopy(mixers[0])
    state = {k: v.float() * 0.5 if k == "A_log" else v.float() for k, v in m.state_dict().items()}
    m.load_state_dict(state)  # copies into the parameters
    assert torch.equal(m.A, expected(m))
    m.to(torch.bfloat16)  # the buffer is derived again in float32, not rounded to bf16
    assert m.A.dtype == torch.float32 and torch.equal(m.A, expected(m))
    address = m.A.data_ptr()
    m.to(torch.bfloat16)
    assert m.A.data_ptr() == address  # unchanged dtype and device: refreshed in place (graphs keep reading it)
    with torch.device("meta"):
        lazy = Mamba2Mixer(64, d_state=16, headdim=16, chunk_size=8)
    lazy.load_state_dict(state, assign=True)
    assert lazy.A.device.type == "cpu" and torch.equal(lazy.A, expected(lazy))
    # The step and the prefill read the buffer: the backbone still equals the recomputed decay rates' results.
    x = torch.randn(2, 9, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    ref = bb(x, bb.allocate_inference_state(2, 16))
    for mixer in mixers:
        mixer.A.fill_(float("nan"))
        mixer.refresh_A()
    torch.testing.assert_close(bb(x, bb.allocate_inference_state(2, 16)), ref, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["hybrid", "transformer"])
@pytest.mark.parametrize("pieces", [[13], [8, 5], [4, 4, 4, 1]])
def test_ragged_prefill_leaves_each_row_its_solo_state(kind, pieces):
    """Rows of lengths 5, 13, 0 and 9 padded to 13 (padding poisoned with large values), prefilled with per-row
    ``valid`` counts in pieces: each row's outputs at its positions, SSM and conv caches, KV rows and position
    equal those of prefilling it alone, and the next decode step too, to float64 rounding (BLAS may sum a GEMM of
    another row count in another order; tests/test_engine.py checks joins batched as the engine runs them equal
    their solo runs exactly)."""
    bb = _backbone(kind, seed=2)
    lengths = [5, 13, 0, 9]
    g = torch.Generator().manual_seed(7)
    x = 1e3 * torch.randn(4, 13, 64, dtype=torch.float64, generator=g)  # poison: the padding must change nothing
    for row, n in enumerate(lengths):
        x[row, :n] = torch.randn(n, 64, dtype=torch.float64, generator=g)
    state = bb.allocate_inference_state(4, 32)
    total = torch.tensor(lengths)
    out, start = [], 0
    for n in pieces:
        out.append(bb(x[:, start : start + n], state, (total - start).clamp(0, n)))
        start += n
    out = torch.cat(out, 1)
    assert state.position.tolist() == lengths
    nxt = torch.randn(4, 1, 64, dtype=torch.float64, generator=g)
    alone = []
    for row, n in enumerate(lengths):
        solo = bb.allocate_inference_state(1, 32)
        if n:
            torch.testing.assert_close(out[row, :n], bb(x[row : row + 1, :n], solo)[0], rtol=0, atol=1e-12)
        for ours, theirs in zip(state.caches, solo.caches):
            for name in ("conv", "ssm") if hasattr(theirs, "ssm") else ("k", "v"):
                a, b = getattr(ours, name)[row], getattr(theirs, name)[0]
                if name in ("k", "v"):
                    a, b = a[:n], b[:n]
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=f"row {row} {name}")
        alone.append(solo)
    step = bb.step(nxt, state)
    for row, solo in enumerate(alone):
        torch.testing.assert_close(step[row], bb.step(nxt[row : row + 1], solo)[0], rtol=0, atol=1e-12)
