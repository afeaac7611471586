"""Persistent CUDA-graph decode runner: ``Zonos._decode_step`` captured once, replayed across requests.

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
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

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


class CudaGraphDecodeStep:
    """A callable with the signature and semantics of ``Zonos._decode_step`` that replays CUDA graphs.

    ``captures`` counts graphs captured so far (one per distinct key; a second request with the same
    batch size, guidance and sampling parameters captures nothing).
    """

    def __init__(self, model):
        if model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device; it is on {model.device}")
        self.model = model
        self.device = model.device
        self.captures = 0
        self._graphs: dict[tuple, _Captured] = {}
        self._watched: set[int] = set()  # ids of states whose collection drops their graphs
        self._generator = torch.Generator(self.device)
        self._stream = torch.cuda.Stream(self.device)

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
        self._graphs[_key(last_codes, recent, remaining, stopping, state, cfg_scale, params, generator)] = entry
        self.captures += 1
        if id(state) not in self._watched:
            self._watched.add(id(state))
            weakref.finalize(state, self._forget, id(state))
        return entry

    def _forget(self, state_id: int) -> None:
        """Drop the graphs of a collected inference state (their kernels point at its freed memory)."""
        self._watched.discard(state_id)
        for key in [k for k in self._graphs if k[0] == state_id]:
            del self._graphs[key]


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


def enable_cuda_graphs(model) -> CudaGraphDecodeStep:
    """Make ``model.generate`` replay CUDA graphs of its decode step; returns the runner (idempotent)."""
    runner = model.__dict__.get("_decode_step")
    if not isinstance(runner, CudaGraphDecodeStep):
        runner = CudaGraphDecodeStep(model)
        model._decode_step = runner
    return runner


def disable_cuda_graphs(model) -> None:
    """Back to the eager decode step (captured graphs are freed with the runner)."""
    model.__dict__.pop("_decode_step", None)
