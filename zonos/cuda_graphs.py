"""CUDA graphs keyed by what the captured work depends on: the one capture-and-replay mechanism behind the engine's
decode steps and prefill pieces (:class:`zonos_accel.graphs.GraphCache`) and the streaming vocoder's pushes, the
slab's included (:class:`zonos.codec.streaming.StreamingDACDecoder`).

The rules, the same for every user of a :class:`GraphSet`:

- A key's calls before its ``capture_at``-th run eagerly and capture nothing (so a one-off shape costs no graph).
  That call runs eagerly too (the real work: lazy initialization, JIT compiles and autotuning happen there, outside
  any capture), and then its work is captured, which runs no kernel. Later calls replay.
- Capture runs on the caller's stream, or on the set's own side stream when the caller is on the legacy default
  stream (where capture is illegal), ordered after the caller's work and before its next.
- Autocast's cast cache is off during a capture: the outermost autocast frees it on exit, and a graph must not read
  freed memory.
- A key whose capture fails (some kernel that cannot be captured) is warned about once and stays eager, which is
  correct. Past ``max_graphs`` graphs, new keys stay eager too.
- Every graph allocates from the set's one memory pool: its user replays them one after another on one stream and
  copies a result out before a later replay can reuse its memory.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Hashable

import torch

NOT_CAPTURED = object()  # what replay() and capture() return for a key without a graph


def _uncached_autocast() -> contextlib.AbstractContextManager:
    """The current CUDA autocast without its cast cache."""
    if torch.is_autocast_enabled("cuda"):
        return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)
    return contextlib.nullcontext()


class GraphSet:
    """Captured CUDA graphs by key, with the static results of their captures (see the module docstring).

    ``captures`` and ``replays`` count what happened, for tests and benchmarks.
    """

    def __init__(self, capture_at: int = 1, max_graphs: int | None = None) -> None:
        if capture_at < 1:
            raise ValueError(f"capture_at counts calls from 1; got {capture_at}")
        self.capture_at = capture_at
        self.max_graphs = max_graphs
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, object]] = {}
        self._seen: dict[Hashable, int] = {}  # eager calls per key without a graph
        self._failed: set[Hashable] = set()
        self._pool = None  # made at the first capture (CUDA only)
        self._side: torch.cuda.Stream | None = None
        self.captures = 0
        self.replays = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def results(self) -> list[object]:
        """The static results of the captured graphs (what their replays overwrite)."""
        return [static for _, static in self._graphs.values()]

    def replay(self, key: Hashable, before: Callable[[object], None] | None = None) -> object:
        """Replay ``key``'s graph and return its static result (valid until a later replay), or :data:`NOT_CAPTURED`
        if it has none. ``before(static result)`` runs first (to copy fresh inputs into what the graph reads)."""
        entry = self._graphs.get(key)
        if entry is None:
            return NOT_CAPTURED
        if before is not None:
            before(entry[1])
        entry[0].replay()
        self.replays += 1
        return entry[1]

    def due(self, key: Hashable) -> bool:
        """Count an eager call of ``key``; True if this call is to be captured after it runs."""
        if key in self._failed or (self.max_graphs is not None and len(self._graphs) >= self.max_graphs):
            return False
        seen = self._seen[key] = self._seen.get(key, 0) + 1
        return seen >= self.capture_at

    def capture(self, key: Hashable, fn: Callable[[], object], device: torch.device) -> object:
        """Capture ``fn()`` on ``device`` as ``key``'s graph (it runs no kernel; host state it changes is the caller's
        to restore) and return its static result, or :data:`NOT_CAPTURED` if it could not be captured (warned)."""
        caller = torch.cuda.current_stream(device)
        stream = caller
        if caller == torch.cuda.default_stream(device):
            if self._side is None or self._side.device != device:
                self._side = torch.cuda.Stream(device)
            stream = self._side
            stream.wait_stream(caller)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with (
                torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"),
                _uncached_autocast(),
            ):
                static = fn()
        except Exception as err:  # noqa: BLE001 - whatever could not be captured stays eager, which is correct
            self._failed.add(key)
            warnings.warn(f"work keyed {_short(key)} could not be captured in a CUDA graph, it stays eager: {err!r}",
                          stacklevel=3)  # fmt: skip
            return NOT_CAPTURED
        finally:
            if stream != caller:
                caller.wait_stream(stream)
        self._graphs[key] = (graph, static)
        self.captures += 1
        return static

    def drop(self, which: Callable[[Hashable], bool] | None = None, forget: bool = True) -> None:
        """Drop the graphs (all, or those whose key ``which`` accepts): their memory goes back to the pool, and no
        later replay touches what they addressed. ``forget=False`` keeps the counts of their keys' calls, so a key
        that was captured is captured again at its next call (what was dropped is known to recur)."""
        for key in [k for k in self._graphs if which is None or which(k)]:
            del self._graphs[key]
        if forget:
            self._seen = {k: n for k, n in self._seen.items() if which is not None and not which(k)}
            self._failed = {k for k in self._failed if which is not None and not which(k)}


def _short(key: Hashable) -> str:
    text = repr(key)
    return text if len(text) <= 120 else text[:117] + "..."
