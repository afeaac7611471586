"""One keyed cache of CUDA graphs for an engine: its decode steps and its prefill pieces.

A decode step at Zonos-v0.1-hybrid size is ~400-1000 small kernels; launched one by one from Python the host
cannot keep up with the GPU, so the engine replays each step from a graph. A graph is keyed by everything the
captured code branches on or bakes in: the state it runs on (its serial, never reused), the bucket of slots, the
sampling filters in use, the logits processors, the model's backend (so switching accelerators captures anew) and
the dtype; an engine's shutdown releases the graphs of its states. The step reads and
writes only the engine's slot tensors, which keep their addresses, so one capture serves every later request.

The first call of a key runs the work eagerly (the real step: lazy initialization, Triton JIT and autotuning,
the CuTeDSL GEMV's compilation happen there, outside any capture) and then captures it without running it;
later calls replay. Capturing runs the Python but no kernels, so the host-side bookkeeping that Python does
(``InferenceState.seqlen``) is restored after it.

Prefill is launch-bound too (~50 ms of host launches for a few ms of GPU work at ~120 tokens): the backbone
over a prefill sequence runs as pieces whose sizes come from the fixed set :data:`PIECE_SIZES`, one graph per
size, each replayed at any position (the backbone reads the start from the state's device ``position``). The
last piece is padded up to its size: per-row ``valid`` lengths keep the padding out of the state.

Every graph allocates from one memory pool: the engine runs them one after the other on one stream, and a
piece's output is copied out before the next replay. Capture and replay follow :mod:`zonos.cuda_graphs`, the same
rules as the streaming vocoder's graphs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zonos.cuda_graphs import NOT_CAPTURED, GraphSet

# Piece sizes. A piece runs every layer once, so it reads every weight once (3.2 GB at Zonos-v0.1-hybrid size)
# and replays ~900 kernels whatever its length: the number of pieces sets a prefill's cost. A sequence runs as
# whole pieces of 256 and one last piece rounded up to a multiple of 16 (padding, which the rows' ``valid``
# lengths keep out of the state), i.e. one piece for any length up to 256, from 16 graphs.
MAX_PIECE = 256
PIECE_STEP = 16
PIECE_SIZES = tuple(range(MAX_PIECE, 0, -PIECE_STEP))


def prefill_pieces(length: int) -> list[int]:
    """Sizes from :data:`PIECE_SIZES`, largest first, whose sum is ``length`` rounded up to a multiple of
    :data:`PIECE_STEP` (the last piece is padded; see the note above)."""
    rest = length % MAX_PIECE
    return [MAX_PIECE] * (length // MAX_PIECE) + ([-(-rest // PIECE_STEP) * PIECE_STEP] if rest else [])


def padded_length(length: int) -> int:
    """The positions the pieces of a ``length``-token prefill write (a state must hold them)."""
    return -(-length // PIECE_STEP) * PIECE_STEP


class GraphCache:
    """CUDA graphs of one engine's work on ``device``, keyed by what they depend on (see the module docstring), in a
    :class:`~zonos.cuda_graphs.GraphSet` (its capture rules: the first call of a key runs eagerly, then captures).

    ``captures`` and ``replays`` count what happened, for tests and benchmarks.
    """

    def __init__(self, device: torch.device | str):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.device = device
        self.graphs = GraphSet(capture_at=1)
        self._inputs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # static prefill-piece inputs

    @property
    def captures(self) -> int:
        return self.graphs.captures

    @property
    def replays(self) -> int:
        return self.graphs.replays

    def clear(self) -> None:
        """Drop every graph (e.g. after the weights moved)."""
        self.graphs.drop()
        self._inputs.clear()

    def release(self, *states) -> None:
        """Drop the graphs captured on ``states`` (an engine's slots and staging state, at its shutdown): their
        memory goes back, and no later replay can touch the states' freed tensors."""
        serials = {state.serial for state in states}
        self.graphs.drop(lambda key: key[1] in serials)
        for key in [k for k in self._inputs if k[1] in serials]:
            del self._inputs[key]

    def run(
        self,
        key: tuple,
        fn: Callable[[], object],
        before_capture: Callable[[], None] | None = None,
        after_capture: Callable[[], None] | None = None,
    ):
        """``fn()``: replayed from the graph of ``key``, or (the first time) run eagerly and then captured.

        ``before_capture`` puts back the host-side state the eager run changed (so the capture's Python run sees
        what the eager one saw); ``after_capture`` sets what the call leaves. Returns the eager result the first
        time and the graph's static result later (valid until the next replay)."""
        static = self.graphs.replay(key)
        if static is not NOT_CAPTURED:
            return static
        result = fn()
        if self.graphs.due(key):
            if before_capture is not None:
                before_capture()
            try:
                self.graphs.capture(key, fn, self.device)
            finally:
                if after_capture is not None:
                    after_capture()
        return result

    def step(self, slots, n: int, use: tuple[bool, ...], processors: tuple, backend) -> None:
        """The engine's decode step over the first ``n`` slots."""
        key = ("step", slots.state.serial, n, use, processors, backend)
        self.run(key, lambda: slots.step(n, use, processors))

    def prefill(self, backbone, hidden: torch.Tensor, state, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``backbone(hidden, state)`` as graph pieces (the backbone's output for every position); ``lengths``
        (b,) on the device: row i's tokens from ``lengths[i]`` on are padding (see ``ZonosBackbone.forward``).
        The state must hold :func:`padded_length` positions; ``state.seqlen`` advances by the unpadded length."""
        b, l, d = hidden.shape
        width = padded_length(l)
        if width > l:
            hidden = torch.cat([hidden, hidden.new_zeros(b, width - l, d)], dim=1)
        if lengths is None:
            lengths = torch.full((b,), l, device=hidden.device, dtype=torch.int64)
        seqlen = state.seqlen
        out = torch.empty_like(hidden)
        start = 0
        for n in prefill_pieces(l):
            valid = (lengths - start).clamp(0, n)
            out[:, start : start + n].copy_(self.prefill_piece(backbone, hidden[:, start : start + n], state, valid))
            start += n
        if seqlen is not None:
            state.seqlen = seqlen + l
        return out[:, :l]

    def prefill_piece(self, backbone, hidden: torch.Tensor, state, valid: torch.Tensor) -> torch.Tensor:
        """``backbone(hidden, state, valid)`` for one piece, whose length is one of :data:`PIECE_SIZES`, from its
        graph (``valid`` (b,): each row's tokens in the piece). Returns the graph's static output: copy it before
        the next replay."""
        b, n, d = hidden.shape
        key = ("prefill", state.serial, n, b, hidden.dtype, backbone.ops)
        static = self._inputs.get(key)
        if static is None:
            static = self._inputs[key] = (
                torch.empty(b, n, d, device=hidden.device, dtype=hidden.dtype),
                torch.empty(b, device=hidden.device, dtype=torch.int64),
            )
        static[0].copy_(hidden)
        static[1].copy_(valid)
        seqlen = state.seqlen  # None for a row view, whose bounds its owner checks

        def set_seqlen(value: int | None) -> None:
            state.seqlen = value

        piece = self.run(
            key,
            lambda: backbone(static[0], state, static[1]),
            before_capture=lambda: set_seqlen(seqlen),  # the capture checks bounds as the eager run did
            after_capture=lambda: set_seqlen(None if seqlen is None else seqlen + n),
        )
        state.seqlen = None if seqlen is None else seqlen + n  # what forward does on the host (a replay does not)
        return piece

    def prepare_prefill(self, backbone, state, sizes=PIECE_SIZES) -> None:
        """Capture the prefill pieces of ``sizes`` now (on a reset ``state``), so no request captures them."""
        d = backbone.config.d_model
        dtype = backbone.norm_f.weight.dtype
        for n in sizes:
            if n > state.max_seqlen:
                continue
            state.reset()
            hidden = torch.zeros(state.batch_size, n, d, device=self.device, dtype=dtype)
            self.prefill(backbone, hidden, state)
        state.reset()
