"""CUDA graph capture and replay, emulated on the CPU, for the streaming decoder's graph logic.

A real capture records kernels without running them; a replay reruns them on the same addresses with whatever
those hold then.  Here a capture runs the push under a dispatch mode that records every op call, then puts the
state buffers' contents back (so, as on CUDA, the capture leaves the state as it found it); a replay reruns the
recorded calls on the recorded tensors, copying each fresh result into the tensor the capture got (which
stands for the memory the graph allocated once).  A replay that a wrong key admits from a state it was not
captured from then reads the wrong buffers and gives the wrong samples, as on the GPU.

``emulate_cuda_graphs(monkeypatch)`` routes :class:`StreamingDACDecoder`'s graph path to it: ``_graphs_on``
follows ``cuda_graphs`` on the CPU, and the ``torch.cuda`` names the decoder uses become stand-ins (one stream;
waits, pools and stream contexts do nothing).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from zonos.codec import StreamingDACDecoder


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.calls.append((func, args, kwargs, out))
        return out


class FakeGraph:
    """``torch.cuda.CUDAGraph`` on the CPU: the op calls of a capture, rerun by :meth:`replay`."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def replay(self) -> None:
        for func, args, kwargs, captured in self.calls:
            fresh = func(*args, **kwargs)
            for old, new in zip(tree_leaves(captured), tree_leaves(fresh)):
                if isinstance(old, torch.Tensor) and _storage(old) != _storage(new):
                    old.copy_(new)  # what a kernel writing into the graph's memory leaves there


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _FakeStream:
    def __init__(self, device=None) -> None:
        self.device = torch.device("cpu")

    def wait_stream(self, other) -> None:
        pass


def emulate_cuda_graphs(monkeypatch) -> None:
    """Make every :class:`StreamingDACDecoder` with ``cuda_graphs`` capture and replay its pushes on the CPU."""
    main = _FakeStream()
    capturing: list[StreamingDACDecoder] = []

    @contextlib.contextmanager
    def graph(g: FakeGraph, pool=None, stream=None, capture_error_mode=None):
        buffers = [b for s in capturing[-1]._all_stages() for b in s._buffers.values()]
        saved = [b.clone() for b in buffers]
        with _Recorder() as rec:
            yield
        g.calls = rec.calls
        for b, s in zip(buffers, saved):  # a capture runs nothing
            b.copy_(s)

    eager_then_capture = StreamingDACDecoder._eager_then_capture

    def tracked(self, *args):
        capturing.append(self)
        try:
            return eager_then_capture(self, *args)
        finally:
            capturing.pop()

    monkeypatch.setattr(StreamingDACDecoder, "_graphs_on", lambda self, device: self.cuda_graphs)
    monkeypatch.setattr(StreamingDACDecoder, "_eager_then_capture", tracked)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
