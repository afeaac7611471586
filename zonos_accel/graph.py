"""Persistent CUDA-graph runners, captured once and replayed across requests: the decode step
(``Zonos._decode_step``) and the backbone's prefill (``Zonos._backbone_prefill``).

Decode
------

A decode step at Zonos-v0.1-hybrid size is ~1000 small kernels; launched one by one from Python the
host cannot keep up with the GPU. :class:`CudaGraphDecodeStep` is a drop-in for the model's
``_decode_step`` (same arguments, same results, ``remaining``/``stopping`` updated in place) that
records the whole step (embed → backbone step → heads → CFG → sampling → EOS bookkeeping) into one
CUDA graph and replays it.

What a replay reads and writes:

- the model's :class:`~zonos.backbone.InferenceState` (caches and the device scalar ``position``). The
  model keeps that state, at fixed addresses, across requests while the batch size fits, so one capture
  serves every later request; a graph is dropped when its state is garbage-collected.
- static copies of the per-step inputs (the repetition-penalty window, whose last column is the step's
  input, ``remaining``, ``stopping``), refreshed before each replay, and of the outputs, copied back after.
- the runner's own ``torch.Generator``, registered with every graph it captures
  (``CUDAGraph.register_generator_state``). Before a replay it takes the seed and Philox offset of the
  caller's generator (or of the device's default generator), and afterwards it hands the advanced offset
  back, so a replay draws exactly the random numbers the eager step would have drawn and leaves the
  caller's generator where the eager step would have left it.

A graph is keyed by everything the captured code branches on or bakes in as a constant: the state
object, the batch, ``cfg_scale`` (its value is a kernel argument) and the sampling parameters. Steps
whose repetition-penalty window is not yet full (the first steps after a short audio prefix), and calls
whose ``last_codes`` is not the last column of ``recent`` (the decode loop always passes that view), run
eagerly.

Prefill
-------

Eager prefill is launch-bound (~50 ms of host launches for a few ms of GPU work at ~120 tokens).
:class:`CudaGraphPrefill` is a drop-in for ``Zonos._backbone_prefill`` (``backbone(hidden, state)``) that
splits the sequence into pieces whose sizes come from the fixed set :data:`PIECE_SIZES` and replays, per
piece, a graph of the whole backbone captured once per (state, piece size, dtype, op backend). A piece
graph serves every position: the backbone reads the start from the device scalar ``state.position`` (KV
rows written with ``index_copy_``, attention masked against it), takes the Mamba2 conv context and the SSD
initial state from the cache (zeros after ``state.reset()``), and advances ``position`` itself. The
runner copies each piece into the graph's static input, replays, copies the output out, and advances
``state.seqlen`` on the host. Embedding the prefix and codes before, and heads, guidance and sampling after,
stay eager (a few launches).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

import zonos.ops
from zonos.backbone import InferenceState
from zonos.model import N_CODEBOOKS
from zonos.sampling import SamplingParams


@dataclass
class _Captured:
    """One captured step: the graph and the static tensors its kernels read and write."""

    graph: torch.cuda.CUDAGraph
    recent: torch.Tensor  # (b, 9, window); the graph reads the last column as the step's input codes
    remaining: torch.Tensor  # (b,)
    stopping: torch.Tensor  # (b,)
    tokens: torch.Tensor  # (b, 9), written by the replay


class _StateGraphs:
    """Graphs keyed by ``(id(state), ...)``, captured on a side stream; ``captures`` counts them. A graph's
    kernels point at its inference state's caches, so the graphs of a state are dropped when it is collected."""

    def __init__(self, model):
        if model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device; it is on {model.device}")
        self.model = model
        self.device = model.device
        self.captures = 0
        self._graphs: dict[tuple, object] = {}
        self._watched: set[int] = set()  # ids of states whose collection drops their graphs
        self._stream = torch.cuda.Stream(self.device)

    def _remember(self, key: tuple, entry, state: InferenceState) -> None:
        self._graphs[key] = entry
        self.captures += 1
        if id(state) not in self._watched:
            self._watched.add(id(state))
            weakref.finalize(state, self._forget, id(state))

    def _forget(self, state_id: int) -> None:
        """Drop the graphs of a collected inference state (their kernels point at its freed memory)."""
        self._watched.discard(state_id)
        for key in [k for k in self._graphs if k[0] == state_id]:
            del self._graphs[key]


class CudaGraphDecodeStep(_StateGraphs):
    """A callable with the signature and semantics of ``Zonos._decode_step`` that replays CUDA graphs.

    ``captures`` counts graphs captured so far (one per distinct key; a second request with the same
    batch size, guidance and sampling parameters captures nothing).
    """

    def __init__(self, model):
        super().__init__(model)
        self._generator = torch.Generator(self.device)

    def _eager(self, *args) -> torch.Tensor:
        """The model's own step (the class method, not this runner installed on the instance)."""
        return type(self.model)._decode_step(self.model, *args)

    @torch.inference_mode()
    def __call__(
        self,
        last_codes: torch.Tensor,
        recent: torch.Tensor,
        remaining: torch.Tensor,
        stopping: torch.Tensor,
        state: InferenceState,
        cfg_scale: float,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        args = (last_codes, recent, remaining, stopping, state, cfg_scale, params, generator)
        window = params.repetition_penalty_window
        if (
            recent.shape[-1] < window  # the first steps after a short audio prefix
            or not _is_last_column(last_codes, recent)  # the decode loop passes a view; others run eagerly
            or (generator is not None and generator.device.type != "cuda")  # gets the eager error
        ):
            return self._eager(*args)
        if state.seqlen + 1 > state.max_seqlen:
            raise ValueError(
                f"{state.seqlen + 1} tokens exceed the inference state's maximum of {state.max_seqlen}: "
                "allocate a larger state (or generate fewer tokens)"
            )
        entry = self._graphs.get(_key(*args))
        if entry is None:
            entry = self._capture(*args)

        entry.recent.copy_(recent[..., -window:])  # one copy brings the step's codes and the penalty window
        entry.remaining.copy_(remaining)
        entry.stopping.copy_(stopping)
        samples = params.temperature > 0
        if samples:
            source = generator if generator is not None else torch.cuda.default_generators[self._device_index()]
            self._generator.manual_seed(source.initial_seed())
            self._generator.set_offset(source.get_offset())
        entry.graph.replay()
        if samples:
            source.set_offset(self._generator.get_offset())
        state.seqlen += 1  # what backbone.step does on the host; the replay advanced state.position
        remaining.copy_(entry.remaining)
        stopping.copy_(entry.stopping)
        return entry.tokens.clone()

    @torch.inference_mode()
    def prepare(self, batch_size: int, cfg_scale: float, sampling_params: dict | SamplingParams) -> None:
        """Capture, ahead of the first request, the graph a ``generate`` call with these arguments replays."""
        model = self.model
        params = (
            sampling_params
            if isinstance(sampling_params, SamplingParams)
            else SamplingParams.from_dict(sampling_params)
        )
        state = model._inference_state(batch_size * (1 if cfg_scale == 1.0 else 2))
        window = params.repetition_penalty_window
        codes = torch.full((batch_size, N_CODEBOOKS, window), model.masked_token_id, device=self.device)
        remaining = torch.ones(batch_size, dtype=torch.long, device=self.device)
        stopping = torch.zeros(batch_size, dtype=torch.bool, device=self.device)
        args = (codes[..., -1:], codes, remaining, stopping, state, cfg_scale, params, None)
        if _key(*args) not in self._graphs:
            self._capture(*args)

    def _device_index(self) -> int:
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def _capture(
        self,
        last_codes: torch.Tensor,
        recent: torch.Tensor,
        remaining: torch.Tensor,
        stopping: torch.Tensor,
        state: InferenceState,
        cfg_scale: float,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> _Captured:
        """Warm up on a scratch state (so the request's state is untouched), then capture against ``state``.

        The static inputs start as copies of this call's inputs, so the warm-up runs on valid code ids.
        """
        window = params.repetition_penalty_window

        def static(t: torch.Tensor) -> torch.Tensor:
            return t.detach().clone(memory_format=torch.contiguous_format)

        rec, rem, stop = static(recent[..., -window:]), static(remaining), static(stopping)
        last = rec[..., -1:]
        main = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(main)
        with torch.cuda.stream(self._stream):
            # Lazy initialization (cuBLAS workspaces for this stream, Triton JIT and autotuning) happens here,
            # outside the capture. The scratch state has the request state's shapes, hence the same kernels.
            scratch = self.model.backbone.allocate_inference_state(state.batch_size, state.max_seqlen)
            self._eager(last, rec, rem.clone(), stop.clone(), scratch, cfg_scale, params, self._generator)
            del scratch
        main.wait_stream(self._stream)

        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self._generator)
        seqlen = state.seqlen
        try:
            with torch.cuda.graph(graph, stream=self._stream, capture_error_mode="thread_local"):
                tokens = self._eager(last, rec, rem, stop, state, cfg_scale, params, self._generator)
        finally:
            state.seqlen = seqlen  # capture only records kernels; the Python bookkeeping ran without them
        entry = _Captured(graph, rec, rem, stop, tokens)
        self._remember(_key(last_codes, recent, remaining, stopping, state, cfg_scale, params, generator), entry, state)
        return entry


def _is_last_column(last_codes: torch.Tensor, recent: torch.Tensor) -> bool:
    """Whether ``last_codes`` is the view ``recent[..., -1:]`` (what ``Zonos._decode_loop`` passes)."""
    last = recent[..., -1:]
    return (
        last_codes.data_ptr() == last.data_ptr()
        and last_codes.shape == last.shape
        and (last_codes.stride() == last.stride())
    )


def _key(last_codes, recent, remaining, stopping, state, cfg_scale, params, generator) -> tuple:
    """What a captured step depends on besides the static inputs: the state it was captured against, the
    shapes and dtypes of the inputs, and the constants baked into its kernels (guidance scale, sampling)."""
    return (id(state), tuple(last_codes.shape), last_codes.dtype, remaining.dtype, float(cfg_scale), params)


# Piece sizes. A piece runs every layer once, so it reads every weight once (3.2 GB at Zonos-v0.1-hybrid size,
# ~0.75 ms at the H200's read bandwidth) and replays ~1000 kernels; up to ~100 tokens a piece should cost about
# what a decode step costs (2.5 ms measured), whatever its size (an estimate, not a measurement). So the schedule
# minimizes the number of pieces: whole pieces of 256, then one multiple of 16, then one piece below 16, i.e. at
# most 2 pieces for any length up to 256 (121 = 112 + 9) from 31 graphs, where binary sizes (256, 128, ..., 1)
# need up to 9 pieces from 9 graphs (121 = 64 + 32 + 16 + 8 + 1).
MAX_PIECE = 256
PIECE_STEP = 16
PIECE_SIZES = tuple(range(MAX_PIECE, 0, -PIECE_STEP)) + tuple(range(PIECE_STEP - 1, 0, -1))


def prefill_pieces(length: int) -> list[int]:
    """Sizes from :data:`PIECE_SIZES`, largest first, that add up to ``length`` (see the note above)."""
    rest = length % MAX_PIECE
    tail = [rest - rest % PIECE_STEP, rest % PIECE_STEP]
    return [MAX_PIECE] * (length // MAX_PIECE) + [n for n in tail if n]


@dataclass
class _Piece:
    """One captured prefill piece: the graph and its static input and output, both (batch, size, d_model)."""

    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor
    out: torch.Tensor


class CudaGraphPrefill(_StateGraphs):
    """A callable with the signature and semantics of ``Zonos._backbone_prefill`` (the backbone over a prefill
    sequence, ``backbone(hidden, state)``) that replays one CUDA graph per piece of the sequence.

    ``captures`` counts graphs captured so far: one per piece size, state, dtype and op backend, so a request
    whose pieces have all been seen captures nothing. :meth:`prepare` captures them ahead of requests.

    Every prefill graph allocates from one memory pool (the pieces run one after the other, and each piece's
    output is copied out before the next replay, which may reuse its memory).
    """

    def __init__(self, model):
        super().__init__(model)
        self._pool = torch.cuda.graph_pool_handle()

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor, state: InferenceState) -> torch.Tensor:
        length = hidden.shape[1]
        self.model.backbone._check(hidden, state, length)
        pieces = prefill_pieces(length)
        backend = _op_backend()
        missing = [n for n in dict.fromkeys(pieces) if (id(state), n, hidden.dtype, backend) not in self._graphs]
        if missing:
            self._capture(missing, state, hidden.dtype, backend)
        out = None
        start = 0
        for n in pieces:
            entry = self._graphs[(id(state), n, hidden.dtype, backend)]
            entry.hidden.copy_(hidden[:, start : start + n])
            entry.graph.replay()
            if out is None:
                out = entry.out.new_empty(hidden.shape)
            out[:, start : start + n].copy_(entry.out)
            state.seqlen += n  # what backbone.forward does on the host; the replay advanced state.position
            start += n
        return out

    @torch.inference_mode()
    def prepare(self, batch_size: int, lengths: list[int] | None = None) -> None:
        """Capture, ahead of requests, the pieces that prefills of these backbone lengths (prefix + 1) replay,
        for a backbone batch of ``batch_size`` (twice the ``generate`` batch with guidance); default: every
        size in :data:`PIECE_SIZES`. Uses (and resets) the model's inference state for that batch."""
        model = self.model
        state = model._inference_state(batch_size)
        sizes = PIECE_SIZES if lengths is None else [n for length in lengths for n in prefill_pieces(length)]
        sizes = [n for n in dict.fromkeys(sizes) if n <= state.max_seqlen]
        backend = _op_backend()
        missing = [n for n in sizes if (id(state), n, model.dtype, backend) not in self._graphs]
        if missing:
            self._capture(missing, state, model.dtype, backend)

    def _capture(self, sizes: list[int], state: InferenceState, dtype: torch.dtype, backend: tuple) -> None:
        """Warm every size up on a scratch state (Triton JIT and autotuning, cuBLAS plans: none of it may run
        inside a capture, and the request's state must stay untouched), then capture each against ``state``."""
        backbone = self.model.backbone
        b, d = state.batch_size, backbone.config.d_model
        inputs = {n: torch.zeros(b, n, d, device=self.device, dtype=dtype) for n in sizes}
        main = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(main)
        with torch.cuda.stream(self._stream):
            scratch = backbone.allocate_inference_state(b, state.max_seqlen)
            for n in sizes:
                scratch.reset()
                backbone(inputs[n], scratch)
            del scratch
        main.wait_stream(self._stream)

        seqlen = state.seqlen
        for n in sizes:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"):
                    out = backbone(inputs[n], state)
            finally:
                state.seqlen = seqlen  # capture only records kernels; the Python bookkeeping ran without them
            self._remember((id(state), n, dtype, backend), _Piece(graph, inputs[n], out), state)


def _op_backend() -> tuple:
    """The functions behind :mod:`zonos.ops` now (a graph replays the kernels of the backend it captured)."""
    return tuple(getattr(zonos.ops, name) for name in zonos.ops.__all__)


def enable_cuda_graphs(model, prefill: bool = True) -> CudaGraphDecodeStep:
    """Make ``model.generate`` replay CUDA graphs of its decode step and (``prefill``) of its prefill's
    backbone pieces (``model._backbone_prefill``, a :class:`CudaGraphPrefill`); returns the decode runner
    (idempotent)."""
    runner = model.__dict__.get("_decode_step")
    if not isinstance(runner, CudaGraphDecodeStep):
        runner = CudaGraphDecodeStep(model)
        model._decode_step = runner
    if not prefill:
        model.__dict__.pop("_backbone_prefill", None)
    elif not isinstance(model.__dict__.get("_backbone_prefill"), CudaGraphPrefill):
        model._backbone_prefill = CudaGraphPrefill(model)
    return runner


def disable_cuda_graphs(model) -> None:
    """Back to the eager decode step and prefill (captured graphs are freed with the runners)."""
    model.__dict__.pop("_decode_step", None)
    model.__dict__.pop("_backbone_prefill", None)
