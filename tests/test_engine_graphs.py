"""The engine's CUDA-graph cache, with capture and replay emulated on the CPU (float64 tiny model): graphs of the
decode step (per bucket, sampling filters and processors) and of the prefill pieces give exactly the codes of
running eagerly, requests that capture nothing replay, and a backend switch captures anew.

A capture here runs the work under a recorder (a real one only records; the run's positions are zeroed so that
its cache writes stay in bounds), then puts every engine tensor back, so as on CUDA it leaves the state as it
found it; a replay reruns the recorded calls on the recorded tensors."""

import contextlib

import pytest
import torch

from tests.replay_on_cpu import FakeGraph, _Recorder
from tests.test_model import _prefix
from tests.tiny import tiny_model
from zonos.cuda_graphs import GraphSet
from zonos.ops.backend import REFERENCE
from zonos_accel.graphs import GraphCache


class CpuGraphCache(GraphCache):
    """:class:`GraphCache` on the CPU (the emulation below stands in for torch.cuda)."""

    def __init__(self):
        self.device = torch.device("cpu")
        self.graphs = GraphSet(capture_at=1)
        self._inputs = {}


def _tensors(model):
    engine = model.engine
    out = [t for t in vars(engine.slots).values() if isinstance(t, torch.Tensor)]
    out += [t for t in vars(engine.slots.params).values() if isinstance(t, torch.Tensor)]
    for state in (engine.slots.state, engine.staging):
        out.append(state.position)
        for c in state.caches:
            out += [t for t in vars(c).values() if isinstance(t, torch.Tensor)]
    return out


@pytest.fixture
def emulated(monkeypatch):
    holder = {}
    main, side = object(), object()

    @contextlib.contextmanager
    def graph(g: FakeGraph, pool=None, stream=None, capture_error_mode=None):
        tensors = _tensors(holder["model"])
        saved = [t.clone() for t in tensors]
        engine = holder["model"].engine
        for state in (engine.slots.state, engine.staging):
            state.position.zero_()  # the recording run executes: keep its cache writes in bounds
        with _Recorder() as rec:
            yield
        g.calls = rec.calls
        for t, s in zip(tensors, saved):  # a capture runs nothing
            t.copy_(s)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: side)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    return holder


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    m = tiny_model(tmp_path_factory.mktemp("graphs"), dtype=torch.float64, max_seqlen=400)
    m.autoencoder.dac.double()
    m.start_engine(slots=4)
    return m


def _requests(model):
    """One-shot and streamed requests of different lengths, sampling filters and prompt lengths (a prompt past
    256 tokens runs several prefill pieces); returns their codes."""
    kw = dict(progress_bar=False)
    short = _prefix(model, "Hi.")
    piece = _prefix(model, "A longer sentence, with more words in it, to speak.")
    long = torch.cat([piece] * -(-270 // piece.shape[1]), dim=1)[:, :270]  # pieces 256 + 16 (1 padding)
    codes = [
        model.generate(short, max_new_tokens=20, generator=torch.Generator().manual_seed(1), **kw),
        model.generate(long, max_new_tokens=12, generator=torch.Generator().manual_seed(2), **kw),
        model.generate(
            short,
            max_new_tokens=16,
            generator=torch.Generator().manual_seed(3),
            sampling_params={"top_k": 20, "temperature": 0.7},
            **kw,
        ),  # fmt: skip
    ]
    chunks = list(model.generate(short, max_new_tokens=24, generator=torch.Generator().manual_seed(4), stream=True,
                                 chunk_frames=4, **kw))  # fmt: skip
    return [*codes, torch.cat([c.codes for c in chunks], -1)]


def test_graphs_equal_eager_and_replay(model, emulated):
    emulated["model"] = model
    eager = _requests(model)
    graphs = CpuGraphCache()
    model.engine.use_graphs(graphs)
    try:
        first = _requests(model)
        captured = graphs.captures
        again = _requests(model)
    finally:
        model.engine.use_graphs(None)
    for a, b, c in zip(eager, first, again):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert captured > 0 and graphs.captures == captured  # the second round captured nothing
    assert graphs.replays > 0


def test_a_backend_switch_captures_anew(model, emulated):
    emulated["model"] = model
    graphs = CpuGraphCache()
    model.set_backend(REFERENCE, graphs)
    prefix = _prefix(model, "Hi.")
    try:
        kw = dict(max_new_tokens=12, progress_bar=False)
        base = model.generate(prefix, generator=torch.Generator().manual_seed(9), **kw)
        n = graphs.captures
        model.set_backend(REFERENCE.replace("copy", linear=lambda x, w, b=None: REFERENCE.linear(x, w, b)))
        other = model.generate(
            prefix, max_new_tokens=12, progress_bar=False, generator=torch.Generator().manual_seed(9)
        )
        assert graphs.captures > n and torch.equal(base, other)
    finally:
        model.set_backend(REFERENCE, None)
