"""The CUDA-graph prefill (``zonos_accel.graphs.GraphCache.prefill``: fixed-size pieces replayed at the device
position) equals the eager one-shot prefill: tiny models in fp32 with the torch ops (tight tolerance), the
tiny hybrid with the Triton ops, and Zonos-v0.1-hybrid in bf16 with every Triton op (within bf16 noise of an
fp32 reference), across requests of different lengths, with no capture once a length's pieces were seen, and
a new capture for a new backend (the pieces are keyed by it)."""

import copy

import pytest
import torch

from tests.tiny import random_state_dict, real_config, tiny_config
from zonos.codebook_pattern import N_CODEBOOKS
from zonos.config import ZonosConfig
from zonos.model import Zonos
from zonos.ops.backend import REFERENCE
from zonos_accel.graphs import GraphCache, prefill_pieces

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
LENGTHS = (120, 40, 299)  # prefix tokens; the backbone sees one more (the first code column)


@pytest.fixture(autouse=True)
def _full_fp32():
    """No TF32 in cuBLAS or cuDNN: eager and graphed pieces may pick different algorithms for their shapes."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _tiny(kind: str) -> Zonos:
    torch.manual_seed(0)
    model = Zonos(ZonosConfig.from_dict(tiny_config(kind)), max_seqlen=512)
    model.load_checkpoint(random_state_dict(model, 0), device="cuda", dtype=torch.float32)
    return model.eval()


def _prefix(length: int, seed: int, d: int = 64, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(2, length, d, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).to(dtype)


def _state(model: Zonos):
    """A 2-row inference state, reused by every prefill of a test (the graphs are keyed by the state)."""
    return model.backbone.allocate_inference_state(2, model.max_seqlen)


@torch.inference_mode()
def _prefill(model: Zonos, prefix: torch.Tensor, state, graphs: GraphCache | None = None) -> dict:
    """What the engine's prefill does (guidance on, backbone rows cond and uncond) on a reset ``state``, eager or
    as ``graphs``' pieces, keeping the backbone output of every position, the logits, and the state it leaves
    (caches, device positions, host seqlen). Runs on a side stream, as the engine does (capture needs one)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        state.reset()
        codes = torch.full((1, N_CODEBOOKS, 1), model.masked_token_id, device="cuda")
        hidden = torch.cat([prefix.to(model.dtype), model.embed_codes(codes).expand(prefix.shape[0], -1, -1)], dim=1)
        out = model.backbone(hidden, state) if graphs is None else graphs.prefill(model.backbone, hidden, state)
        # Keys and values past the sequence are scratch: a padded last piece writes them, decode overwrites them
        # before any query reads them.
        caches = [
            t.clone()
            for c in state.caches
            for t in ((c.k[:, : state.seqlen], c.v[:, : state.seqlen]) if hasattr(c, "k") else (c.conv, c.ssm))
        ]
        result = {
            "hidden": out.float(),
            "logits": model.guided_logits(out[:, -1], torch.full((1,), 2.0, device="cuda")),
            "caches": caches,
            "position": state.position.tolist(),
            "seqlen": state.seqlen,
        }
    torch.cuda.synchronize()
    return result


def _assert_close(graph: dict, eager: dict, tol: float) -> None:
    assert graph["seqlen"] == eager["seqlen"] and graph["position"] == eager["position"] == [eager["seqlen"]] * 2
    torch.testing.assert_close(graph["hidden"], eager["hidden"], rtol=tol, atol=tol)
    finite = torch.isfinite(eager["logits"])
    assert torch.equal(finite, torch.isfinite(graph["logits"]))
    torch.testing.assert_close(graph["logits"][finite], eager["logits"][finite], rtol=tol, atol=tol)
    for g, e in zip(graph["caches"], eager["caches"]):
        torch.testing.assert_close(g, e, rtol=tol, atol=tol)


def _distinct_pieces(lengths) -> int:
    return len({n for length in lengths for n in prefill_pieces(length + 1)})


@pytest.mark.parametrize("kind", ["hybrid", "transformer"])
def test_graphed_prefill_equals_eager_across_requests(kind):
    model = _tiny(kind)
    state = _state(model)
    prefixes = [_prefix(length, seed) for seed, length in enumerate(LENGTHS)]
    eager = [_prefill(model, p, state) for p in prefixes]

    graphs = GraphCache("cuda")
    graph = [_prefill(model, p, state, graphs) for p in prefixes]
    assert graphs.captures == _distinct_pieces(LENGTHS)
    replays = graphs.replays
    again = [_prefill(model, p, state, graphs) for p in reversed(prefixes)][::-1]  # other order, other positions
    assert graphs.captures == _distinct_pieces(LENGTHS)  # later requests replay the same graphs
    assert graphs.replays - replays == sum(len(prefill_pieces(n + 1)) for n in LENGTHS)
    for e, g, a in zip(eager, graph, again):
        _assert_close(g, e, 1e-5)
        _assert_close(a, e, 1e-5)


def test_prepare_captures_every_piece_ahead():
    model = _tiny("hybrid")
    state = _state(model)
    graphs = GraphCache("cuda")
    side = torch.cuda.Stream()
    with torch.inference_mode(), torch.cuda.stream(side):
        graphs.prepare_prefill(model.backbone, state, sizes=prefill_pieces(121))
    torch.cuda.synchronize()
    assert graphs.captures == 1  # 121 tokens: one piece of 128
    prefix = _prefix(120, 9)
    graph = _prefill(model, prefix, state, graphs)
    assert graphs.captures == 1
    _assert_close(graph, _prefill(model, prefix, state), 1e-5)


def test_graphed_prefill_with_triton_ops_equals_eager_reference_and_is_keyed_by_the_backend():
    """One graph cache for two backends: the Triton backend's pieces are captured anew (not replayed from the
    reference's), and switching back replays the reference's."""
    from zonos_accel.triton import DEFAULT_OPS, triton_backend

    model = _tiny("hybrid")
    state = _state(model)
    prefixes = [_prefix(length, seed) for seed, length in enumerate(LENGTHS)]
    eager = [_prefill(model, p, state) for p in prefixes]  # the torch references
    graphs = GraphCache("cuda")
    graphed_reference = [_prefill(model, p, state, graphs) for p in prefixes]
    pieces = _distinct_pieces(LENGTHS)
    assert graphs.captures == pieces
    # ssd_scan is left out: mamba_ssm's chunked kernels need larger chunks than the tiny model's 8.
    model.set_backend(triton_backend(REFERENCE, tuple(op for op in DEFAULT_OPS if op != "ssd_scan")))
    try:
        fast = [_prefill(model, p, state, graphs) for p in prefixes]
        assert graphs.captures == 2 * pieces
    finally:
        model.set_backend(REFERENCE)
    back = [_prefill(model, p, state, graphs) for p in prefixes]
    assert graphs.captures == 2 * pieces
    for e, r, f, b in zip(eager, graphed_reference, fast, back):
        _assert_close(r, e, 1e-5)
        _assert_close(f, e, 1e-4)
        _assert_close(b, e, 1e-5)


def real_size_bf16(max_seqlen: int = 4096) -> Zonos:
    """Zonos-v0.1-hybrid with small random weights (the scheme of benchmarks/common.py), bf16 on CUDA."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Zonos(ZonosConfig.from_dict(real_config("hybrid")), max_seqlen=max_seqlen)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if name.endswith(("A_log", "dt_bias", "mixer.D")):
                continue
            if name.endswith("weight") and p.ndim == 1:
                p.fill_(1.0)
            elif p.ndim == 1:
                p.zero_()
            else:
                p.normal_(0.0, p.shape[-1] ** -0.5 if "embed" not in name else 1.0)
    return model.to(torch.bfloat16).eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_real_size_bf16_triton_graphed_prefill_within_bf16_noise():
    """Every Triton op (mamba_ssm's chunked scan with the cache's initial state included): the graphed pieces
    sit as close to an fp32 torch-reference prefill as the eager one-shot bf16 prefill does (the pieces add
    only the bf16 rounding of the SSM state at piece boundaries), and a second round of requests captures
    nothing."""
    from zonos_accel.triton import triton_backend

    model = real_size_bf16()
    reference = copy.deepcopy(model).float()
    reference.set_backend(REFERENCE)
    lengths = (120, 300)  # pieces 128 (7 padding), and 256 + 48 (3 padding)
    prefixes = [_prefix(length, seed, d=2048, dtype=torch.bfloat16) for seed, length in enumerate(lengths)]
    ref_state = _state(reference)
    ref = [_prefill(reference, p, ref_state) for p in prefixes]
    del reference, ref_state
    model.set_backend(triton_backend())
    state = _state(model)
    eager = [_prefill(model, p, state) for p in prefixes]
    graphs = GraphCache("cuda")
    graph = [_prefill(model, p, state, graphs) for p in prefixes]
    captures = graphs.captures
    assert captures == _distinct_pieces(lengths)
    again = [_prefill(model, p, state, graphs) for p in prefixes]
    assert graphs.captures == captures
    for r, e, g, a in zip(ref, eager, graph, again):
        assert g["seqlen"] == e["seqlen"] and g["position"] == e["position"] == [e["seqlen"]] * 2
        for key in ("hidden", "logits"):
            finite = torch.isfinite(r[key])
            assert torch.equal(finite, torch.isfinite(g[key])) and torch.equal(finite, torch.isfinite(e[key]))
            noise = _rel(e[key][finite], r[key][finite])
            assert noise < 0.1, (key, noise)  # sanity: the eager bf16 prefill tracks the fp32 one
            for run in (g, a):
                err = _rel(run[key][finite], r[key][finite])
                assert err <= 1.5 * noise + 1e-3, (key, err, noise)


def _snapshot(out: torch.Tensor, state, rows: slice, n: int) -> dict:
    """A sequence's prefill output at its ``n`` positions and the caches it leaves in ``rows`` of ``state`` (keys
    and values at its positions only), in float."""
    snap = {"out": out[rows, :n].float()}
    for i, c in enumerate(state.caches):
        for name in ("conv", "ssm") if hasattr(c, "ssm") else ("k", "v"):
            t = getattr(c, name)[rows]
            snap[f"{i}.{name}"] = (t[:, :n] if name in ("k", "v") else t).float()
    return snap


def test_real_size_bf16_ragged_graphed_prefill_matches_each_sequence_alone():
    """The engine's batched join with every Triton op: three sequences of 121, 41 and 301 tokens and an empty
    bucket row pair, padded to 301 (padding poisoned with large values) and run as the graphed pieces of 301 with
    per-row lengths, leave each sequence an output at its positions, SSM, conv and KV states and a position as
    close to its fp32 eager prefill alone as its own graphed bf16 prefill alone is (its pieces differ: 256 + 48
    batched, 128 alone; bf16 GEMMs of other shapes round differently, so the two bf16 runs are compared through
    the fp32 reference, not to each other)."""
    from zonos_accel.triton import triton_backend

    model = real_size_bf16(max_seqlen=512)
    d = model.config.backbone.d_model
    lengths = [n for n in (121, 41, 301, 0) for _ in range(2)]  # cond, uncond rows per sequence
    g = torch.Generator("cuda").manual_seed(4)
    hidden = 30 * torch.randn(8, 301, d, device="cuda", generator=g)
    for row, n in enumerate(lengths):
        hidden[row, :n] = torch.randn(n, d, device="cuda", generator=g)
    hidden = hidden.to(torch.bfloat16)
    sequences = [(slice(2 * j, 2 * j + 2), n) for j, n in enumerate(lengths[::2]) if n]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(side):
        reference = copy.deepcopy(model).float()
        reference.set_backend(REFERENCE)
        ref = []
        for rows, n in sequences:
            alone = _state(reference)
            ref.append(_snapshot(reference.backbone(hidden[rows, :n].float(), alone), alone, slice(0, 2), n))
        del reference, alone
        model.set_backend(triton_backend())
        graphs = GraphCache("cuda")
        state = model.backbone.allocate_inference_state(8, model.max_seqlen)
        out = graphs.prefill(model.backbone, hidden, state, torch.tensor(lengths, device="cuda"))
        assert state.position.tolist() == lengths
        for (rows, n), r in zip(sequences, ref):
            alone = _state(model)
            solo = _snapshot(graphs.prefill(model.backbone, hidden[rows, :n], alone), alone, slice(0, 2), n)
            batched = _snapshot(out, state, rows, n)
            for key, expected in r.items():
                noise = _rel(solo[key], expected)
                assert noise < 0.1, (n, key, noise)  # sanity: the bf16 prefill alone tracks the fp32 one
                err = _rel(batched[key], expected)
                assert err <= 1.5 * noise + 1e-3, (n, key, err, noise)
    torch.cuda.synchronize()
