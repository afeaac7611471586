"""GraphSet's capture rules (zonos.cuda_graphs), with torch.cuda's graph calls stood in for on the CPU: a key is
captured at its capture_at-th call and replayed after; a failed capture warns and leaves the key eager; past
max_graphs new keys stay eager; dropping forgets or keeps the counts; a caller on the default stream captures on
the set's own side stream and waits for it."""

import contextlib

import pytest
import torch

from zonos.cuda_graphs import NOT_CAPTURED, GraphSet


class _Graph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


class _Stream:
    def __init__(self, device=None) -> None:
        self.device = torch.device("cpu")
        self.waited: list = []

    def wait_stream(self, other) -> None:
        self.waited.append(other)


@pytest.fixture
def cuda(monkeypatch):
    state = {"current": _Stream(), "captured_on": []}
    state["default"] = state["current"]

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None, capture_error_mode=None):
        state["captured_on"].append(stream)
        yield

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: state["current"])
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: state["default"])
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    return state


def _call(graphs: GraphSet, key, counter: list) -> object:
    """A user of the set: replay, or run eagerly and capture when due. Returns what the call handed out."""
    static = graphs.replay(key)
    if static is not NOT_CAPTURED:
        return static
    counter.append(key)  # an eager run
    if graphs.due(key):
        graphs.capture(key, lambda: f"static {key}", torch.device("cpu"))
    return f"eager {key}"


@pytest.mark.parametrize("capture_at", [1, 2, 3])
def test_captured_at_its_call_then_replayed(cuda, capture_at):
    graphs, eager = GraphSet(capture_at=capture_at), []
    out = [_call(graphs, "k", eager) for _ in range(capture_at + 2)]
    assert out == ["eager k"] * capture_at + ["static k"] * 2
    assert graphs.captures == 1 and graphs.replays == 2 and len(eager) == capture_at


def test_a_failed_capture_warns_and_stays_eager(cuda):
    graphs = GraphSet()

    def broken():
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs.due("k")
    with pytest.warns(UserWarning, match="could not be captured"):
        assert graphs.capture("k", broken, torch.device("cpu")) is NOT_CAPTURED
    assert not graphs.due("k") and graphs.replay("k") is NOT_CAPTURED and graphs.captures == 0
    graphs.drop()  # forgotten: it may be tried again
    assert graphs.due("k")


def test_past_max_graphs_new_keys_stay_eager(cuda):
    graphs, eager = GraphSet(max_graphs=2), []
    for _ in range(3):
        for key in "abc":
            _call(graphs, key, eager)
    assert len(graphs) == 2 and eager.count("c") == 3


def test_drop_forgets_or_keeps_the_counts(cuda):
    graphs, eager = GraphSet(capture_at=2), []
    for _ in range(3):
        for key in (("x", 1), ("y", 2)):
            _call(graphs, key, eager)
    graphs.drop(lambda key: key[1] == 1)
    assert graphs.replay(("x", 1)) is NOT_CAPTURED and graphs.replay(("y", 2)) == "static ('y', 2)"
    assert not graphs.due(("x", 1))  # counted from 1 again: captured at its second call
    graphs.drop(forget=False)
    assert len(graphs) == 0 and graphs.due(("y", 2))  # kept count: captured at its next call


def test_default_stream_callers_capture_on_a_side_stream(cuda):
    graphs = GraphSet()
    graphs.due("k")
    graphs.capture("k", lambda: 1, torch.device("cpu"))
    side = cuda["captured_on"][0]
    assert side is not cuda["default"] and side.waited == [cuda["default"]] and cuda["default"].waited == [side]
    cuda["current"] = _Stream()  # a caller on its own stream captures there
    graphs.due("j")
    graphs.capture("j", lambda: 2, torch.device("cpu"))
    assert cuda["captured_on"][1] is cuda["current"] and graphs.results() == [1, 2]
