"""The engine: every generation is a request on it.

An :class:`Engine` owns a model's decode state (:class:`~zonos.engine.slots.Slots`), a queue of requests and a
worker thread that runs them. A request joins a free slot between decode steps, advances one frame per step
alongside the other slots, and leaves at EOS, at its length, when its callback says stop, or when it is cancelled,
freeing the slot at once. Requests queued together join together: their prefixes are prefilled in one batch (up to
:data:`JOIN_BATCH` sequences on staging rows, each row padded to the longest prefix and masked past its own; see
``ZonosBackbone.forward``), then copied into their slots. While other requests run, the batch's prefill pieces
alternate with their decode steps (as vLLM's chunked prefill does), so a join stalls them by one piece at most.
Each step runs the smallest bucket of slots (:func:`~zonos.utils.batch_buckets`: 1, 2, 4, ... 32, then every 32,
and ``slots``) that holds every active one, so a step pays for about the rows it needs.

Results reach the caller through a :class:`RequestHandle`: the one-shot codes (:meth:`RequestHandle.result`) or,
for a stream, the :class:`~zonos.streaming.AudioChunk` s as they are decoded (iterate the handle). Submitting is
thread-safe, so many threads (or an asyncio loop, through ``run_in_executor``) can share one engine; a request
runs the same tensors alone or beside others, so its codes do not depend on what else runs (exactly, in float64
on the CPU).

With ``graphs`` (a :class:`zonos_accel.graphs.GraphCache`, which ``Zonos.use_accelerators`` sets up on CUDA),
the decode step of each (bucket, sampling features, backend) and each prefill piece are captured once and
replayed; the key includes the model's backend, so switching accelerators takes effect at the next step.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from zonos.codebook_pattern import N_CODEBOOKS, UNKNOWN, apply_delay_pattern, revert_delay_pattern
from zonos.codec.dac import DACConfig
from zonos.codec.streaming import StreamingDACDecoder, WeightCasts, steady_state_size
from zonos.engine.slots import MAX_WINDOW, Slots, row_view
from zonos.engine.vocoding import SlabVocoding
from zonos.errors import EngineClosedError, EngineFullError, ZonosInputError
from zonos.ops.sampler import features, row_params_for, to_device
from zonos.sampling import SamplingParams
from zonos.streaming import DEFAULT_CHUNK_FRAMES, AudioChunk, ChunkAssembler, playable
from zonos.utils import batch_buckets

VOCODER_FRAMES = 4  # frames per vocoder slab push; docs/BENCHMARKS.md, decisions: VOCODER_FRAMES
SYNC_EVERY = 4  # steps between reads of the slots' flags (see _ActiveWatch); docs/BENCHMARKS.md, decisions: SYNC_EVERY
# Sequences prefilled together (one backbone call per piece, their rows padded to the longest): a prefill of ~120
# tokens is launch-bound (9 ms GPU for ~1.1 ms of GEMM work at 2 rows on the H200), so up to ~4 sequences cost
# about what one does. docs/BENCHMARKS.md, decisions: JOIN_BATCH
JOIN_BATCH = 4
# Decode steps queued on the GPU at most: after launching a step the host waits for the one this many before it.
# Enough that the GPU never waits on the host's bookkeeping between steps; few enough that a join's prefill, queued
# behind them, is not delayed by more (without a bound only the slab's ring stops the host, 32 steps ahead).
# docs/BENCHMARKS.md, decisions: IN_FLIGHT
IN_FLIGHT = 2
# Positions the staging rows hold past max_seqlen: a graphed prefill's last piece is padded up to a multiple of
# zonos_accel.graphs.PIECE_STEP (tests/test_engine.py checks the two agree).
STAGING_ROOM = 16
_DONE = object()  # end of a handle's items


@dataclass
class Request:
    """One generation: ``batch_size`` sequences continuing one conditioning prefix.

    Attributes:
        prefix: (2, L, d) cond ‖ uncond rows from ``prepare_conditioning`` (shared by the batch), or
            (2·batch_size, L, d): batch_size cond rows, then as many uncond rows; with ``cfg_scale`` 1.0 the
            cond rows alone may be given.
        audio_prefix_codes: (1 or batch_size, 9, T) codes to continue (included in the result), or None.
        max_new_tokens: most frames to generate.
        cfg_scale: classifier-free guidance (1.0: the conditional logits alone).
        sampling: the sampling parameters.
        seeds: one noise seed per sequence (``Zonos.generate`` draws them from its generator).
        stream: hand out audio chunks as frames complete instead of the codes at the end.
        first_chunk_frames, chunk_frames: the stream's chunk schedule (see :mod:`zonos.streaming`).
        callback: ``callback(frame, step, max_steps)`` after each decode step, on the engine's thread; a
            falsy return stops the request (upstream's rule: only a true value continues).
        logits_processor: ``fn(logits (b, 9, V) float, step (b,) int64) -> logits``, applied to this request's
            rows before sampling: tensor work only (it is captured in CUDA graphs), e.g. to suppress EOS. The step's
            graph is keyed by the processors in use, so pass one function object, not a new closure per request.
        progress: a tqdm-like bar advanced once per decode step, or None.
        decoder: for a stream, a ``StreamingDACDecoder`` to decode with (e.g. one a previous request of the same
            utterance left mid-stream, see :mod:`zonos.longform`); None: one of the engine's.
        emit_prefix: for a stream, whether the audio prefix's frames are vocoded and handed out too.
        flush: for a stream, whether its last chunk flushes the decoder (False leaves it for a later request).
    """

    prefix: torch.Tensor
    audio_prefix_codes: torch.Tensor | None = None
    max_new_tokens: int = 86 * 30
    cfg_scale: float = 2.0
    batch_size: int = 1
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(min_p=0.1))
    seeds: list[int] = field(default_factory=lambda: [0])
    stream: bool = False
    first_chunk_frames: int = 1
    chunk_frames: int = 16
    callback: Callable | None = None
    logits_processor: Callable | None = None
    progress: object | None = None
    decoder: object | None = None
    emit_prefix: bool = True
    flush: bool = True


class RequestHandle:
    """What :meth:`Engine.submit` returns: iterate it for a stream's chunks, or call :meth:`result` for the codes.

    Closing (:meth:`cancel`, leaving a ``with`` block, or dropping the last reference) cancels the request; its
    slot is free at the next step. Errors raised while the request ran are raised here.
    """

    def __init__(self, engine: Engine, request: Request):
        self._engine = weakref.ref(engine)
        self.request = request
        self._items: queue.Queue = queue.Queue()
        self.cancelled = False
        self.done = False
        self.ttfa: float | None = None  # seconds from submit to the first chunk handed out (streams)
        self.submitted = time.perf_counter()
        self.started: float | None = None  # perf_counter when it joined the decode steps (queued and prefilled)

    def __iter__(self) -> Iterator[AudioChunk]:
        if not self.request.stream:
            raise TypeError("a one-shot request has no chunks: call result()")
        while True:
            item = self._get()
            if item is _DONE:
                return
            yield item

    def result(self, timeout: float | None = None) -> torch.Tensor:
        """The codes (batch, 9, frames) of a one-shot request, once it has finished."""
        if self.request.stream:
            raise TypeError("a stream hands out chunks: iterate the handle")
        item = self._get(timeout)
        if item is _DONE:
            raise RuntimeError("the request was cancelled before it finished")
        return item

    def _get(self, timeout: float | None = None):
        item = self._items.get(timeout=timeout)
        if isinstance(item, BaseException):
            self._items.put(_DONE)
            raise item
        if item is _DONE:
            self._items.put(_DONE)  # later reads see the end too
            return item
        codes = item.codes if isinstance(item, AudioChunk) else item
        if codes.is_cuda:
            # Made on the engine's streams and complete (the engine synchronized); the caller's stream uses it now,
            # so its memory must not go back to the engine's streams before that work is done.
            codes.record_stream(torch.cuda.current_stream(codes.device))
        return item

    def cancel(self) -> None:
        """Stop the request (queued or running); its slot is free at the next step. Idempotent."""
        if self.done or self.cancelled:
            return
        self.cancelled = True
        engine = self._engine()
        if engine is not None:
            engine._wake()

    def __enter__(self) -> RequestHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()

    def __del__(self) -> None:
        self.cancel()


class _Job:
    """A request in the engine: its handle, slots and host-side progress."""

    def __init__(self, request: Request, handle: RequestHandle, processor: int):
        self.request = request
        self.handle = weakref.ref(handle)  # an abandoned handle cancels the job
        self.items = handle._items
        self.processor = processor
        # The caller's stream made the request's tensors; the engine's stream waits for it before reading them.
        self.ready = None
        if request.prefix.is_cuda:
            self.ready = torch.cuda.Event()
            self.ready.record(torch.cuda.current_stream(request.prefix.device))
        self.slots: list[int] = []
        self.index: torch.Tensor | None = None  # the slots, as a device index
        self.delayed: torch.Tensor | None = None  # (batch, 9, columns) delayed codes while it joins
        self.prefixes: list[torch.Tensor] | None = None  # each own prefix's rows (2, l, d) while it joins
        self.failed = False  # its prefill failed (the error went to its caller)
        self.offset = 0  # host's count of the last written column (the device's while active)
        self.limit = 0
        self.max_steps = 0
        self.steps = 0
        self.joined = 0  # the engine's step count when the job joined its slots
        self.eos_free = 0  # frames known to hold no EOS (from the slots' flags)
        self.assembler: ChunkAssembler | None = None
        self.decoder = None
        self.pending: deque[tuple[AudioChunk, object]] = deque()  # chunks whose audio is still on its way
        self.first_audio: float | None = None  # perf_counter when the first chunk was handed out
        self.row: int | None = None  # its vocoder slab row (zonos.engine.vocoding), while it holds one
        self.slab = None  # its chunks as the slab's pushes come back (a SlabStream)
        self.slab_first = 0  # the stream frame its row's next push starts at
        self.skip = 0  # audio prefix frames not emitted
        self.audio_out = 0.0  # seconds of audio handed out

    def cancelled(self) -> bool:
        handle = self.handle()
        return handle is None or handle.cancelled

    def slack(self, now: float) -> float:
        """Seconds of audio handed out that have not played yet (inf before the first chunk)."""
        if self.first_audio is None:
            return math.inf
        return self.audio_out - (now - self.first_audio)


class Engine:
    """Runs :class:`Request` s for ``model`` in ``slots`` decode slots of up to ``max_seqlen`` backbone tokens.

    Args:
        model: a loaded :class:`zonos.model.Zonos`.
        slots: requests (batch rows) decoded together; memory for them is allocated now.
        max_seqlen: longest prefix + generated sequence a slot holds (default: the model's).
        queue_size: requests that may wait for a slot; a submit beyond raises :class:`EngineFullError`.
        graphs: a CUDA-graph cache (``zonos_accel.graphs.GraphCache``) or None for eager steps.
        vocoder_streams: CUDA streams the streaming vocoders run on (round-robin over requests).
        vocoder_batching: decode the frames of every batch-1 stream together, as rows of one vocoder slab pushed
            every ``vocoder_frames`` steps (:mod:`zonos.engine.vocoding`); the audio is the same. Off: each stream
            on a decoder of its own (as streams continuing a decoder, e.g. long-form segments, always are).
        vocoder_frames: frames per slab push (a stream's first audio waits up to this many steps longer).
        prefill_chunk: without graphs, the most prefill tokens run between two decode steps while other requests
            run (None: a join's whole prefill at once). With graphs the pieces are the graph cache's sizes.
    """

    @staticmethod
    def check_args(
        slots: object,
        max_seqlen: object,
        queue_size: object,
        vocoder_streams: object,
        vocoder_batching: object,
        vocoder_frames: object = VOCODER_FRAMES,
        prefill_chunk: object = None,
    ) -> None:
        """Refuse arguments the engine cannot run with (:class:`ZonosInputError`), before anything is allocated or
        a previous engine is shut down."""
        if prefill_chunk is not None and (
            isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1
        ):
            raise ZonosInputError(f"prefill_chunk must be None or a positive int, got {prefill_chunk!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ZonosInputError(f"slots must be a positive int, got {slots!r}")
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ZonosInputError(
                f"queue_size must be a positive int (every request passes through the queue), got {queue_size!r}"
            )
        if max_seqlen is not None and (
            isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < N_CODEBOOKS + 2
        ):
            raise ZonosInputError(
                f"max_seqlen must be an int of at least {N_CODEBOOKS + 2} (prefix + frames + {N_CODEBOOKS} delay "
                f"steps), got {max_seqlen!r}"
            )
        if isinstance(vocoder_streams, bool) or not isinstance(vocoder_streams, int) or vocoder_streams < 1:
            raise ZonosInputError(f"vocoder_streams must be a positive int, got {vocoder_streams!r}")
        if not isinstance(vocoder_batching, bool):
            raise ZonosInputError(f"vocoder_batching must be a bool (True or False), got {vocoder_batching!r}")
        if isinstance(vocoder_frames, bool) or not isinstance(vocoder_frames, int) or not 1 <= vocoder_frames <= 64:
            raise ZonosInputError(f"vocoder_frames must be an int from 1 to 64, got {vocoder_frames!r}")

    def __init__(
        self,
        model,
        slots: int = 4,
        max_seqlen: int | None = None,
        queue_size: int = 256,
        graphs=None,
        vocoder_streams: int = 4,
        vocoder_batching: bool = True,
        vocoder_frames: int = VOCODER_FRAMES,
        prefill_chunk: int | None = None,
    ):
        self.check_args(slots, max_seqlen, queue_size, vocoder_streams, vocoder_batching, vocoder_frames, prefill_chunk)
        self.model = model
        self.max_seqlen = model.max_seqlen if max_seqlen is None else max_seqlen
        self.device = model.device
        self.join_batch = min(JOIN_BATCH, slots)
        check_memory(
            model, slots, self.max_seqlen, vocoder_batching=vocoder_batching, vocoder_frames=vocoder_frames,
            staging=self.join_batch,
        )  # fmt: skip
        self.slots = Slots(model, slots, self.max_seqlen)
        # Joins prefill on these rows (two per sequence), then copy into their slots. One view per bucket of
        # sequences, made once: graphs are keyed by the state's serial.
        self.staging = model.backbone.allocate_inference_state(2 * self.join_batch, self.max_seqlen + STAGING_ROOM)
        self.staging_rows = {u: row_view(self.staging, 0, 2 * u) for u in batch_buckets(self.join_batch)}
        self.prefill_chunk = prefill_chunk
        self._joining: _Joining | None = None
        self.queue_size = queue_size
        self.graphs = graphs
        self.vocoder_graphs = graphs is not None
        self.buckets = batch_buckets(slots)
        self._queue: deque[_Job] = deque()
        self._running: list[_Job] = []
        self._finishing: list[_Job] = []  # ended solo streams whose last audio is on its way (slots already free)
        self._free = list(range(slots))
        self._processors: list[Callable] = []
        self._decoders: list = []  # idle streaming vocoders, reused (with their CUDA graphs) by later streams
        self._casts = WeightCasts()  # the codec's weights cast once for all of them
        self._cv = threading.Condition()
        self._work = threading.RLock()  # held while the worker touches the model (accelerator switches wait)
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # Streams' vocoder pushes go to these CUDA streams round-robin: a push is ~50 small dependent kernels, so
        # pushes of different streams on different CUDA streams overlap each other and the decode step.
        cuda = self.device.type == "cuda"
        self._sides = [torch.cuda.Stream(self.device) for _ in range(vocoder_streams)] if cuda else []
        self._next_side = 0
        self._watch = _ActiveWatch(slots, self.device)
        self._in_flight: deque[torch.cuda.Event] = deque()  # the last steps' completion events (CUDA)
        self.vocoder_streams = vocoder_streams
        self.vocoder_batching = vocoder_batching
        self.vocoder_frames = vocoder_frames
        self.vocoding: SlabVocoding | None = None  # the vocoder slab (with vocoder_batching), and its counts
        if vocoder_batching:
            self.vocoding = SlabVocoding(
                lambda: model.autoencoder, self.slots, vocoder_frames, self.vocoder_graphs, self._casts,
                model.eos_token_id, torch.cuda.Stream(self.device) if cuda else None,
            )  # fmt: skip
        self.steps = 0  # decode steps run
        self.join_batches = 0  # batched prefills run (each of up to join_batch sequences)
        self.join_sequences = 0  # the sequences they prefilled
        self.join_pieces = 0  # their pieces
        self.step_seconds = 0.0  # host time in them (wall: launches, or the whole step on the CPU)
        self.join_seconds = 0.0  # host time in joins: admission, planning, prefill pieces, slot loads
        self.slab_seconds = 0.0  # host time in slab pushes and in collecting their copies (waits included)
        self.wait_seconds = 0.0  # host time waiting for the step IN_FLIGHT steps back (the GPU's backlog)

    # ------------------------------------------------------------------------------------------ public

    def submit(self, request: Request) -> RequestHandle:
        """Queue ``request`` (validated here, before any GPU work) and return its handle."""
        self._check(request)
        handle = RequestHandle(self, request)
        with self._cv:
            if self._closed:
                raise EngineClosedError("the engine was shut down; create a new one (or load the model again)")
            if self._waiting() >= self.queue_size:
                raise EngineFullError(
                    f"the engine's queue is full ({self.queue_size} requests wait for its {self.slots.count} slots); "
                    "retry later, or create the engine with more slots or a larger queue_size"
                )
            processor = 0
            if request.logits_processor is not None:
                processor = self._processor_index(request.logits_processor)
            self._queue.append(_Job(request, handle, processor))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zonos-engine", daemon=True)
                self._thread.start()
                atexit.register(self.shutdown)  # a worker killed inside a CUDA call at exit aborts the process
            self._cv.notify_all()
        return handle

    def _waiting(self) -> int:
        """Queued requests the free slots cannot take (call holding ``_cv``): the worker moves the others into
        slots at its next iteration, so they do not count against ``queue_size``."""
        free, waiting = len(self._free), 0
        for job in self._queue:
            if waiting == 0 and job.request.batch_size <= free:
                free -= job.request.batch_size  # the worker admits in order: the first that does not fit waits
            else:
                waiting += 1
        return waiting

    def _processor_index(self, fn: Callable) -> int:
        """``fn``'s index + 1 in the processors the step applies (the step's graph key holds them): a processor no
        queued or running request uses any more gives its place up."""
        in_use = {job.processor for job in [*self._queue, *self._running]}
        for i, p in enumerate(self._processors):
            if p is not None and i + 1 not in in_use and p is not fn:
                self._processors[i] = None
        if fn in self._processors:
            return self._processors.index(fn) + 1
        if None in self._processors:
            i = self._processors.index(None)
            self._processors[i] = fn
            return i + 1
        self._processors.append(fn)
        return len(self._processors)

    def on_worker_thread(self) -> bool:
        """Whether the calling thread is this engine's step loop (where its kernels are launched)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def shutdown(self, wait: bool = True) -> None:
        """Cancel every request and stop the worker; later submits raise :class:`EngineClosedError`. With ``wait``,
        the CUDA graphs captured on this engine's state are released too (the graph cache is the model's)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        atexit.unregister(self.shutdown)
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if wait and self.graphs is not None:
            with self._work:
                self.graphs.release(self.slots.state, self.staging, *self.staging_rows.values())

    @property
    def busy(self) -> bool:
        """Whether requests are queued or hold slots (running, or joining: their prefill runs)."""
        with self._cv:
            return bool(self._queue) or len(self._free) < self.slots.count

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def active(self) -> int:
        return len(self._running)

    def use_graphs(self, graphs) -> None:
        """Capture and replay with ``graphs`` (a ``zonos_accel.graphs.GraphCache``; None: run eagerly) from the next
        step on; idle streaming vocoders are dropped (their graphs replay the backend they captured)."""
        with self._work:
            self.graphs = graphs
            self.vocoder_graphs = graphs is not None
            self._decoders.clear()
            if self.vocoding is not None:
                self.vocoding.cuda_graphs = self.vocoder_graphs

    def prepare_prefill(self) -> None:
        """Capture every prefill piece size of every bucket of joining sequences now (with graphs on), so no request
        of any prompt length captures."""
        if self.graphs is None:
            return
        with self._work, torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
            for rows in self.staging_rows.values():
                self.graphs.prepare_prefill(self.model.backbone, rows)
        if self._stream is not None:
            self._stream.synchronize()

    def idle(self) -> threading.RLock:
        """A context (``with engine.idle():``) in which no request runs (the worker waits): e.g. to switch
        accelerators."""
        return self._work

    # ----------------------------------------------------------------------------------------- checks

    def _check(self, r: Request) -> None:
        needed = r.prefix.shape[1] + (0 if r.audio_prefix_codes is None else r.audio_prefix_codes.shape[2])
        needed += r.max_new_tokens + N_CODEBOOKS
        if needed > self.max_seqlen:
            audio = "" if r.audio_prefix_codes is None else f", the audio prefix {r.audio_prefix_codes.shape[2]} frames"
            raise ZonosInputError(
                f"the prefix is {r.prefix.shape[1]} tokens{audio} and {r.max_new_tokens} new frames need "
                f"{N_CODEBOOKS} more steps: {needed} > max_seqlen {self.max_seqlen}. Split the text into shorter "
                "pieces (e.g. sentences), lower max_new_tokens, or load the model with a larger max_seqlen."
            )
        if r.batch_size > self.slots.count:
            raise ZonosInputError(
                f"batch_size {r.batch_size} needs as many slots, and this engine has {self.slots.count}: create it "
                "with more slots"
            )
        if r.sampling.repetition_penalty_window > MAX_WINDOW:
            raise ZonosInputError(
                f"repetition_penalty_window {r.sampling.repetition_penalty_window} exceeds the {MAX_WINDOW} columns "
                "a slot keeps; use a shorter window"
            )
        if len(r.seeds) != r.batch_size:
            raise ZonosInputError(f"a request needs one seed per sequence: {len(r.seeds)} for batch {r.batch_size}")

    # ------------------------------------------------------------------------------------------ worker

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _run(self) -> None:
        stream = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        with torch.inference_mode(), stream:
            while True:
                with self._cv:
                    self._drop_cancelled_queued()
                    while not self._closed and not self._queue and not self._running and self._joining is None:
                        if self._finishing or self.vocoding is not None and self.vocoding.busy:
                            # only last chunks on their way: poll them (and push the slab), no decode step
                            self._cv.wait(0.0005)
                            break
                        self._cv.wait()
                        self._drop_cancelled_queued()
                    if self._closed:
                        break
                with self._work:
                    try:
                        self._iteration()
                    except Exception as err:  # noqa: BLE001 - a failed step fails the requests in it, not the engine
                        joining, self._joining = self._joining, None
                        for job in list(self._running) + ([] if joining is None else joining.jobs):
                            self._fail(job, err)
            self._close_all()

    def _iteration(self) -> None:
        self._finish_streams()
        for job in list(self._running):
            if job.cancelled():
                self._end(job, deliver=False)
        started = time.perf_counter()
        if self._joining is None:
            self._joining = self._admit()
        if self._joining is not None:
            # Beside running requests one piece per step, so a join stalls them by one piece at most; alone, all.
            while not self._advance_join() and not self._running:
                pass
        self.join_seconds += time.perf_counter() - started
        if self._running:
            self._step()
        elif self.vocoding is not None and self.vocoding.members:
            self._slab_tick()  # only ended streams' last audio to push: no frames to wait for
        if self.vocoding is not None:
            started = time.perf_counter()
            self._collect_slab()
            self.slab_seconds += time.perf_counter() - started

    def _drop_cancelled_queued(self) -> None:
        for job in [j for j in self._queue if j.cancelled()]:
            self._queue.remove(job)
            job.items.put(_DONE)

    def _admit(self) -> _Joining | None:
        """The queued requests that join now, in order: as many as the free slots hold, while their sequences with
        prefixes of their own fit one batched prefill (the first always joins, in several batches if it must)."""
        jobs: list[_Job] = []
        units: list[_Unit] = []
        with self._cv:
            while self._queue and len(self._free) >= self._queue[0].request.batch_size:
                job = self._queue[0]
                if jobs and len(units) + _own_prefixes(job.request) > self.join_batch:
                    break
                self._queue.popleft()
                job.slots = [self._free.pop(0) for _ in range(job.request.batch_size)]
                self._free.sort()
                jobs.append(job)
                units += [_Unit(job, i) for i in range(_own_prefixes(job.request))]
        if not jobs:
            return None
        for job in jobs:
            try:
                self._plan(job)
            except Exception as err:  # noqa: BLE001 - the request's error goes to its caller; the engine goes on
                self._fail(job, err)
        return _Joining(jobs, [u for u in units if not u.job.failed], self.join_batch)

    def _plan(self, job: _Job) -> None:
        """The request's delayed codes (its audio prefix in them), columns and each own prefix's rows (2, l, d)."""
        model, r = self.model, job.request
        device = self.device
        if job.ready is not None:
            torch.cuda.current_stream(device).wait_event(job.ready)
        b = r.batch_size
        prefix = r.prefix.to(device, model.dtype)
        audio = r.audio_prefix_codes
        audio_len = 0 if audio is None else audio.shape[2]
        columns = audio_len + r.max_new_tokens + N_CODEBOOKS
        codes = torch.full((b, N_CODEBOOKS, audio_len + r.max_new_tokens), UNKNOWN, device=device, dtype=torch.long)
        if audio is not None:
            codes[..., :audio_len] = audio.to(device).long()
        job.delayed = apply_delay_pattern(codes, model.masked_token_id)
        offset = audio_len + 1
        job.offset, job.limit, job.max_steps = offset, columns - 1, columns - offset
        job.index = to_device(job.slots, torch.int64, device)
        job.skip = 0 if r.emit_prefix else audio_len
        job.prefixes = [
            torch.cat([_pair(prefix, i, b, r.cfg_scale), model.embed_codes(job.delayed[i : i + 1, :, :offset])
                       .expand(2, -1, -1)], dim=1)
            for i in range(_own_prefixes(r))
        ]  # fmt: skip

    def _advance_join(self) -> bool:
        """Run the joining requests' next prefill piece; after a batch's last piece sample its sequences' first
        tokens and load their slots, and after the last batch start the requests. True when they have started."""
        joining = self._joining
        if joining.batch is None:
            if not joining.next_batch():
                return self._start_joined()
            u = next(b for b in self.staging_rows if b >= len(joining.batch))
            rows = self.staging_rows[u]
            rows.reset()
            self.join_batches += 1
            self.join_sequences += len(joining.batch)
            lengths = [p.shape[1] for unit in joining.batch for p in (unit.prefix,) * 2]
            joining.begin(rows, lengths + [0] * (rows.batch_size - len(lengths)), self._pieces, self.device)
        start, n = joining.piece()
        hidden = joining.hidden[:, start : start + n]
        valid = (joining.lengths - start).clamp(0, n)
        if self.graphs is None:
            out = self.model.backbone(hidden, joining.rows, valid)
        else:
            out = self.graphs.prefill_piece(self.model.backbone, hidden, joining.rows, valid)
        joining.take(out)
        self.join_pieces += 1
        if joining.pieces_left():
            return False
        self._load(joining)
        joining.batch = None
        return self._start_joined() if joining.done() else False

    def _start_joined(self) -> bool:
        joining, self._joining = self._joining, None
        for job in joining.jobs:
            if not job.failed:
                self._start(job)
        return True

    def _pieces(self, length: int) -> list[int]:
        if self.graphs is not None:
            return _graph_pieces(length)
        chunk = self.prefill_chunk or length
        return [min(chunk, length - start) for start in range(0, length, chunk)]

    def _load(self, joining: _Joining) -> None:
        """A prefilled batch: each sequence's first token sampled from its prefix's last position, its slot loaded
        from the prefix's two staging rows; every sequence of the batch at once (a fixed number of launches, one
        call of each logits processor), so a join's host time does not grow with the sequences it holds."""
        model, device = self.model, self.device
        u = len(joining.batch)
        last = joining.last()[: 2 * u]
        cfg = to_device([unit.job.request.cfg_scale for unit in joining.batch], torch.float32, device)
        prefilled = model.guided_logits(last, cfg)
        seqs = [(j, unit.job, i) for j, unit in enumerate(joining.batch) if not unit.job.failed
                for i in unit.sequences()]  # fmt: skip
        logits = prefilled.index_select(0, to_device([j for j, _, _ in seqs], torch.int64, device))
        for index in sorted({job.processor for _, job, _ in seqs} - {0}):
            mine = [k for k, (_, job, _) in enumerate(seqs) if job.processor == index]
            rows = to_device(mine, torch.int64, device)
            fn = seqs[mine[0]][1].request.logits_processor
            try:
                step = torch.zeros(len(mine), dtype=torch.long, device=device)
                logits = logits.index_copy(0, rows, _processed(fn, logits.index_select(0, rows), step))
            except Exception as err:  # noqa: BLE001 - e.g. a processor's error: it fails its requests only
                for job in dict.fromkeys(seqs[k][1] for k in mine):
                    self._fail(job, err)
        keep = [k for k, (_, job, _) in enumerate(seqs) if not job.failed]
        if not keep:
            return
        if len(keep) < len(seqs):
            logits = logits.index_select(0, to_device(keep, torch.int64, device))
            seqs = [seqs[k] for k in keep]
        try:
            n = len(seqs)
            requests = [job.request for _, job, _ in seqs]
            sampling = [r.sampling for r in requests]
            seeds = [r.seeds[i] for (_, _, i), r in zip(seqs, requests)]
            tokens = model.backbone.ops.sample_rows(
                logits,
                row_params_for(sampling, device),
                torch.zeros(n, N_CODEBOOKS, MAX_WINDOW, dtype=torch.long, device=device),
                torch.zeros(n, MAX_WINDOW, dtype=torch.bool, device=device),
                to_device(seeds, torch.int64, device),
                torch.zeros(n, dtype=torch.long, device=device),
                features(sampling),
            )
            width = max(job.delayed.shape[-1] for _, job, _ in seqs)
            delayed = torch.full((n, N_CODEBOOKS, width), UNKNOWN, dtype=torch.long, device=device)
            for k, (_, job, i) in enumerate(seqs):
                delayed[k, :, : job.delayed.shape[-1]] = job.delayed[i]
            # The first token goes where the sequence's column is still unknown (an audio prefix's columns stay).
            at = (
                to_device([job.offset for _, job, _ in seqs], torch.int64, device)
                .view(n, 1, 1)
                .expand(-1, N_CODEBOOKS, 1)
            )
            column = delayed.gather(2, at)
            delayed.scatter_(2, at, torch.where(column == UNKNOWN, tokens[..., None], column))
            self.slots.load(
                [job.slots[i] for _, job, i in seqs],
                joining.rows,
                [j for j, _, _ in seqs],
                [joining.batch[j].prefix.shape[1] for j, _, _ in seqs],
                delayed,
                [job.offset for _, job, _ in seqs],
                [job.limit for _, job, _ in seqs],
                [r.cfg_scale for r in requests],
                seeds,
                sampling,
                [job.processor for _, job, _ in seqs],
            )
        except Exception as err:  # noqa: BLE001 - it fails this batch's requests, not the engine
            for job in dict.fromkeys(job for _, job, _ in seqs):
                if not job.failed:
                    self._fail(job, err)

    def _start(self, job: _Job) -> None:
        """A prefilled request joins the decode steps (and, streamed, the vocoder slab or a decoder of its own)."""
        model, r = self.model, job.request
        job.prefixes = job.delayed = None
        handle = job.handle()
        if handle is not None:
            handle.started = time.perf_counter()
        self.slots.activate(job.index)
        job.joined = self.steps
        self._running.append(job)
        try:
            if r.stream and self.vocoding is not None and self.vocoding.eligible(r):
                if self.vocoding.admit(job, self.steps, job.skip, r.first_chunk_frames, r.chunk_frames):
                    return
            if r.stream:
                job.decoder = r.decoder if r.decoder is not None else self._decoder()
                job.assembler = ChunkAssembler(
                    job.decoder,
                    model.eos_token_id,
                    r.first_chunk_frames,
                    r.chunk_frames,
                    self._side_stream(),
                    skip_frames=job.skip,
                    flush=r.flush,
                )
        except Exception as err:  # noqa: BLE001 - the request's error goes to its caller; the engine goes on
            self._fail(job, err)

    def _side_stream(self):
        if not self._sides:
            return None
        self._next_side = (self._next_side + 1) % len(self._sides)
        return self._sides[self._next_side]

    def _decoder(self) -> StreamingDACDecoder:
        if self._decoders:
            return self._decoders.pop()
        return StreamingDACDecoder(self.model.autoencoder, cuda_graphs=self.vocoder_graphs, casts=self._casts)

    def _free_decoder(self, decoder: StreamingDACDecoder) -> None:
        """Back to the pool (with its CUDA graphs) for a later stream."""
        decoder.reset()
        self._decoders.append(decoder)

    def _step(self) -> None:
        started = time.perf_counter()
        slots = self.slots
        top = max(s for job in self._running for s in job.slots) + 1
        n = next(b for b in self.buckets if b >= top)
        use = features([job.request.sampling for job in self._running])
        # Only the running requests' processors: one left registered by a request that failed at its prefill (or
        # has ended) must not run, nor fail the step for the others.
        in_use = {job.processor for job in self._running}
        processors = tuple(p if i in in_use else None for i, p in enumerate(self._processors, start=1))
        if self.graphs is None:
            slots.step(n, use, processors)
        else:
            self.graphs.step(slots, n, use, processors, self.model.backbone.ops)
        self.steps += 1
        self.step_seconds += time.perf_counter() - started
        if self._stream is not None:
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            self._in_flight.append(done)
            if len(self._in_flight) > IN_FLIGHT:
                started = time.perf_counter()
                self._in_flight.popleft().synchronize()
                self.wait_seconds += time.perf_counter() - started
        for job in self._running:
            if job.offset < job.limit:
                job.offset += 1
                job.steps += 1
        for job in list(self._running):
            self._after_step(job)
        if self.vocoding is not None and self.vocoding.due(self.steps):
            self._slab_tick()
        seen = self._watch.poll(self.steps, slots.active, slots.stopping | slots.prefill_eos, slots.offset)
        if seen is not None:
            as_of, ended, stopped, offsets = seen
            for job in list(self._running):
                if job.joined >= as_of:  # flags copied before the job joined describe the slot's previous request
                    continue
                if all(ended[s] for s in job.slots):
                    # Ended before step as_of: the offsets read with the flags are final (no read of the device).
                    self._end(job, deliver=True, offset=max(offsets[s] for s in job.slots))
                elif not any(stopped[s] for s in job.slots):
                    # No EOS in codebook 0 up to the column written at step as_of (the prefill's columns included),
                    # i.e. in frames before it.
                    job.eos_free = max(job.eos_free, job.offset - (self.steps - as_of))

    def _after_step(self, job: _Job) -> None:
        r = job.request
        try:
            if r.progress is not None:
                r.progress.update()
            if r.callback is not None:
                frame = self.slots.delayed[job.index, :, job.offset : job.offset + 1]
                if not r.callback(frame, job.steps, job.max_steps):
                    self._end(job, deliver=True)
                    return
            if job.assembler is not None:
                self._hand_out(job)
                if job.assembler.due(job.offset):
                    job.assembler.take(self._delayed(job), job.offset, job.eos_free)
                    if job.assembler.finished:
                        self._end(job, deliver=True)
                        return
                    job.pending.append(job.assembler.vocode(final=False))
                    # A stream alone waits for its first audio here (time to first audio); beside others the
                    # wait would stall every stream's next step, so the chunk goes out at a later step's poll.
                    self._hand_out(job, wait_first=len(self._running) == 1)
            if job.offset >= job.limit:
                # The device's offsets are at most the host's, which is final here: columns past a row's own end
                # are cut at its EOS, as they would be at the device's offset.
                self._end(job, deliver=True, offset=job.offset)
        except Exception as err:  # noqa: BLE001 - e.g. a callback's error: it ends this request only
            self._fail(job, err)

    def _delayed(self, job: _Job) -> torch.Tensor:
        return self.slots.delayed[job.index, :, : job.offset + 1]

    def _hand_out(self, job: _Job, wait_first: bool = False) -> None:
        """Hand out the chunks whose audio has arrived, in order (waiting for the first audio of a stream)."""
        while job.pending:
            chunk, event = job.pending[0]
            if event is not None and not event.query():
                if not (wait_first and job.first_audio is None):
                    return
                event.synchronize()
            job.pending.popleft()
            if job.first_audio is None and chunk.audio.shape[-1]:
                job.first_audio = time.perf_counter()
                handle = job.handle()
                if handle is not None:
                    handle.ttfa = job.first_audio - handle.submitted
            job.audio_out += chunk.audio.shape[-1] / self.model.autoencoder.sampling_rate
            job.items.put(chunk)

    def _end(self, job: _Job, deliver: bool, offset: int | None = None) -> None:
        """Finish ``job`` (its result or last chunk out when ``deliver``) and free its slots. ``offset``: its last
        written column when the host knows it (else it is read from the device, which waits for the GPU). A stream's
        last chunk is handed out once its audio has arrived (:meth:`_finish_streams`), without waiting here."""
        if job in self._running:
            self._running.remove(job)
        if job.row is not None:
            if deliver and not job.cancelled():
                # Its row pushes on until its last sample is out (_collect_slab); the slot stays its until then, its
                # steps stopped (a callback may stop a stream with steps left).
                self.vocoding.end(job, job.offset if offset is None else offset)
                for s in job.slots:
                    self.slots.release(s)
                return
            self.vocoding.drop(job)
        result = None
        finishing = False
        try:
            if deliver and not job.cancelled() and job.slab is None:
                if offset is None:
                    offset = int(self.slots.offset[job.index].max())
                if job.assembler is None:
                    # Put after the slots are free, so a caller that has its result sees the engine idle.
                    result = _frames(self.slots.delayed[job.index, :, : job.limit + 1], offset, self.model.eos_token_id)
                else:
                    job.assembler.take(self.slots.delayed[job.index, :, : offset + 1], offset)
                    job.pending.append(job.assembler.vocode(final=True))
                    self._hand_out(job)
                    finishing = bool(job.pending)
        except Exception as err:  # noqa: BLE001
            job.items.put(err)
        if finishing:  # the slots are free now; the decoder is kept until its last audio has arrived
            self._release(job, keep_decoder=True)
            self._finishing.append(job)
            return
        self._release(job)
        self._close(job, result)

    def _close(self, job: _Job, result=None) -> None:
        """The end of ``job``'s items: its result (one-shot), then the end marker."""
        handle = job.handle()
        if handle is not None:
            handle.done = True
        if result is not None:
            job.items.put(result)
        job.items.put(_DONE)

    def _slab_tick(self) -> None:
        """Push the slab (its ring of host buffers full: after collecting the oldest copy, waiting for it)."""
        started = time.perf_counter()
        while self.vocoding.full:
            self._collect_slab(wait=True)
        self.vocoding.tick()
        self.slab_seconds += time.perf_counter() - started

    def _collect_slab(self, wait: bool = False) -> None:
        """Hand out the slab's chunks whose copies have arrived (``wait``: the oldest one's, waiting for it); close the
        streams whose rows have drained. A stream alone waits for its first audio (time to first audio); beside
        others that would stall their steps."""
        vocoding = self.vocoding
        while True:
            results = vocoding.collect_one(wait or len(self._running) <= 1 and vocoding.expects_first_audio())
            wait = False
            if results is None:
                return
            for job, chunk, drained in results:
                if job.cancelled():
                    self._end(job, deliver=False)
                    continue
                if chunk is not None:
                    self._deliver(job, chunk)
                if drained:
                    if job in self._running:
                        self._running.remove(job)
                    self._release(job)
                    self._close(job)

    def _deliver(self, job: _Job, chunk: AudioChunk) -> None:
        if job.first_audio is None and chunk.audio.shape[-1]:
            job.first_audio = time.perf_counter()
            handle = job.handle()
            if handle is not None:
                handle.ttfa = job.first_audio - handle.submitted
        job.audio_out += chunk.audio.shape[-1] / self.model.autoencoder.sampling_rate
        job.items.put(chunk)

    def _finish_streams(self) -> None:
        """Hand out the last chunks of ended streams whose audio has arrived, and close them."""
        for job in list(self._finishing):
            self._hand_out(job)
            if not job.pending:
                self._finishing.remove(job)
                self._release_decoder(job, wait=False)
                self._close(job)

    def _fail(self, job: _Job, err: BaseException) -> None:
        job.failed = True
        if job in self._running:
            self._running.remove(job)
        self._release(job)
        job.items.put(err)
        job.items.put(_DONE)

    def _release(self, job: _Job, keep_decoder: bool = False) -> None:
        if job.row is not None:
            self.vocoding.drop(job)
        for s in job.slots:
            self.slots.release(s)
        with self._cv:
            self._free = sorted(set(self._free) | set(job.slots))
        job.slots = []
        if not keep_decoder:
            self._release_decoder(job)

    def _release_decoder(self, job: _Job, wait: bool = True) -> None:
        """Back to the pool with the job's decoder; ``wait`` for its side stream first (False: the job's last
        push is known to have completed)."""
        if job.decoder is not None:
            if wait and job.assembler is not None and job.assembler.side is not None:
                job.assembler.side.synchronize()
            if job.decoder is not job.request.decoder:  # the engine's own: back to the pool
                self._free_decoder(job.decoder)
            job.decoder = None

    def _close_all(self) -> None:
        with self._cv:
            queued, self._queue = list(self._queue), deque()
        draining = []
        if self.vocoding is not None:
            draining = [job for job in self.vocoding.members.values() if job not in self._running]
        joining, self._joining = self._joining, None
        if joining is not None:
            draining += [job for job in joining.jobs if not job.failed]
        for job in queued + list(self._running) + list(self._finishing) + draining:
            job.items.put(EngineClosedError("the engine was shut down before the request finished"))
            self._release(job)
            job.items.put(_DONE)
        self._running.clear()
        self._finishing.clear()


def _frames(delayed: torch.Tensor, offset: int, eos_token_id: int) -> torch.Tensor:
    """One-shot result: frames complete once column ``offset`` is written, cut before the EOS frame when every
    row has one (upstream's length), EOS/MASK/unwritten codes as 0."""
    codes = revert_delay_pattern(delayed)[..., : max(offset - N_CODEBOOKS + 1, 0)]
    eos = codes[:, 0] == eos_token_id
    if codes.shape[-1] and bool(eos.any(-1).all()):
        codes = codes[..., : int(eos.int().argmax(-1).max())]
    codes = playable(codes)
    if codes.is_cuda:
        torch.cuda.current_stream(codes.device).synchronize()
    return codes


def _own_prefixes(r: Request) -> int:
    """How many of the request's sequences prefill rows of their own: all of them when the prefix (or the audio
    prefix) has rows per sequence, else one, whose state every sequence starts from."""
    b = r.batch_size
    rows_per_item = b > 1 and r.prefix.shape[0] == (b if r.cfg_scale == 1.0 else 2 * b)
    per_item_audio = r.audio_prefix_codes is not None and r.audio_prefix_codes.shape[0] > 1
    return b if rows_per_item or per_item_audio else 1


def _graph_pieces(length: int) -> list[int]:
    from zonos_accel.graphs import prefill_pieces  # zonos imports zonos_accel only when graphs are on

    return prefill_pieces(length)


@dataclass
class _Unit:
    """One own prefix of a joining request: sequence ``index``'s rows, or with one prefix for the request, every
    sequence's."""

    job: _Job
    index: int

    @property
    def prefix(self) -> torch.Tensor:
        return self.job.prefixes[self.index]

    def sequences(self) -> range:
        own = len(self.job.prefixes)
        return range(self.index, self.index + 1) if own > 1 else range(self.job.request.batch_size)


class _Joining:
    """Requests being prefilled: their own prefixes in batches of up to ``join_batch``, each batch's rows padded to
    its longest prefix and run on staging rows piece by piece (the engine interleaves the pieces with decode steps)."""

    def __init__(self, jobs: list[_Job], units: list[_Unit], join_batch: int):
        self.jobs = jobs
        self._units = units
        self._join_batch = join_batch
        self.batch: list[_Unit] | None = None  # the batch in flight
        self.rows = None  # its staging rows (an InferenceState view)
        self.hidden: torch.Tensor | None = None  # (rows, longest, d), zeros past each row's prefix
        self.lengths: torch.Tensor | None = None  # (rows,) on the device
        self._lengths: list[int] = []
        self._pieces: list[int] = []
        self._start = 0
        self._last: torch.Tensor | None = None  # (rows, d): each row's output at its last prefix position

    def next_batch(self) -> bool:
        """Take the next batch of units (False when none is left)."""
        if not self._units:
            return False
        self.batch, self._units = self._units[: self._join_batch], self._units[self._join_batch :]
        return True

    def begin(self, rows, lengths: list[int], pieces: Callable[[int], list[int]], device: torch.device) -> None:
        """Lay the batch's prefixes out on ``rows`` (``lengths``: one per row, 0 for rows no unit uses)."""
        self._pieces = pieces(max(lengths))
        first = self.batch[0].prefix
        # as wide as the pieces: a graphed last piece is padded (zeros past every row's prefix either way)
        self.hidden = first.new_zeros(rows.batch_size, sum(self._pieces), first.shape[2])
        for j, unit in enumerate(self.batch):
            self.hidden[2 * j : 2 * j + 2, : unit.prefix.shape[1]] = unit.prefix
        self.rows = rows
        self._lengths = lengths
        self.lengths = to_device(lengths, torch.int64, device)
        self._start = 0
        self._last = first.new_zeros(rows.batch_size, first.shape[2])

    def piece(self) -> tuple[int, int]:
        """(start, length) of the next piece."""
        return self._start, self._pieces[0]

    def take(self, out: torch.Tensor) -> None:
        """The piece's output (rows, n, d): keep each row's last prefix position if it lies in the piece."""
        start, n = self._start, self._pieces.pop(0)
        for row, length in enumerate(self._lengths):
            if start < length <= start + n:
                self._last[row] = out[row, length - 1 - start]
        self._start += n

    def pieces_left(self) -> bool:
        return bool(self._pieces)

    def done(self) -> bool:
        """Every batch has been loaded into its slots."""
        return self.batch is None and not self._units

    def last(self) -> torch.Tensor:
        return self._last


def _pair(prefix: torch.Tensor, i: int, batch: int, cfg_scale: float) -> torch.Tensor:
    """Sequence ``i``'s (cond, uncond) prefix rows (2, L, d). With guidance off only the cond row counts (it goes
    in twice; the second row's logits are not used): row ``i`` of one cond row per sequence, else row 0."""
    n = prefix.shape[0]
    if cfg_scale == 1.0:
        row = i if n == batch else 0
        return prefix[row : row + 1].expand(2, -1, -1)
    if n == 2:
        return prefix
    return torch.stack([prefix[i], prefix[batch + i]])


class _ActiveWatch:
    """The slots' active flags and offsets, read without draining the GPU's queue: every ``SYNC_EVERY`` steps they
    are copied to pinned host memory behind an event and read ``SYNC_EVERY`` steps later, when the GPU has normally
    passed them (reading at once would stall the host until the queue drains, then leave the GPU idle while it
    refills). An end is seen fewer than ``2 * SYNC_EVERY`` steps after it happens; on the CPU at once."""

    def __init__(self, slots: int, device: torch.device):
        self.cuda = device.type == "cuda"
        self.flags = torch.zeros(2, slots, dtype=torch.bool, pin_memory=self.cuda)  # active, stopping
        self.offsets = torch.zeros(slots, dtype=torch.int64, pin_memory=self.cuda)
        self.event = torch.cuda.Event() if self.cuda else None
        self.submitted: int | None = None

    def poll(
        self, step: int, active: torch.Tensor, stopping: torch.Tensor, offset: torch.Tensor
    ) -> tuple[int, list[bool], list[bool], list[int]] | None:
        """``(as_of, ended, stopped, offsets)``: per slot whether it had ended, whether it had sampled EOS, and its
        last written column, after step ``as_of``; None when nothing new was read."""
        if not self.cuda:
            return step, (~active).tolist(), stopping.tolist(), offset.tolist()
        ended = None
        if self.submitted is not None and step - self.submitted >= SYNC_EVERY:
            self.event.synchronize()
            ended = self.submitted, (~self.flags[0]).tolist(), self.flags[1].tolist(), self.offsets.tolist()
            self.submitted = None
        if self.submitted is None and step % SYNC_EVERY == 0:
            self.flags.copy_(torch.stack([active, stopping]), non_blocking=True)
            self.offsets.copy_(offset, non_blocking=True)
            self.event.record()
            self.submitted = step
        return ended


def slot_bytes(model, max_seqlen: int) -> int:
    """Device bytes one slot's decode state takes (two backbone rows of caches and its delayed codes)."""
    state = model.backbone.allocate_inference_state(2, max_seqlen, device="meta")
    caches = sum(
        t.numel() * t.element_size()
        for c in state.caches
        for t in (getattr(c, a) for a in ("k", "v", "conv", "ssm") if hasattr(c, a))
    )
    return caches + N_CODEBOOKS * max_seqlen * 8


def vocoder_bytes(vocoder_batching: bool, vocoder_frames: int = VOCODER_FRAMES) -> int:
    """Device bytes of streaming vocoder state one slot's stream may hold, for the published codec in fp16: a decoder
    of its own at the default chunk size (28 MiB: streams that continue a decoder run on one), and with
    ``vocoder_batching`` its slab row too (steady state at ``vocoder_frames``: 7.2 MiB at 4)."""
    size = steady_state_size(DACConfig(), DEFAULT_CHUNK_FRAMES)
    if vocoder_batching:
        size += steady_state_size(DACConfig(), vocoder_frames)
    return 2 * size


def _processed(processor: Callable, logits: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """A request's logits processor on the prefill's logits, its result checked (metadata only: no wait on the
    GPU), so a processor returning None or another shape fails its request with a message, not a traceback."""
    out = processor(logits.clone(), step)
    if not isinstance(out, torch.Tensor) or out.shape != logits.shape or not out.is_floating_point():
        got = f"a {out.dtype} tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else repr(out)[:60]
        raise ZonosInputError(
            f"logits_processor must return float logits of the shape it is given {tuple(logits.shape)}; it returned "
            f"{got}"
        )
    return out


def _host_available() -> int | None:
    """Bytes of host memory available (Linux's MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(
    model,
    slots: int,
    max_seqlen: int,
    headroom: float = 0.1,
    vocoder_batching: bool = True,
    vocoder_frames: int = VOCODER_FRAMES,
    staging: int = 1,
) -> None:
    """Raise a clear error (naming the most slots that fit) when ``slots`` slots of ``max_seqlen`` tokens and their
    streams' vocoder state would not fit in the GPU's free memory, keeping ``headroom`` of it (and 2 GiB) for
    activations, graphs and weights cast for the vocoders; on the CPU, the slots' state against the host memory
    available (where the system says; ``generate(batch_size=10**6)`` grows the engine to a million slots).
    ``staging``: sequences the joins prefill together, each on staging rows the size of a slot."""
    state = slot_bytes(model, max_seqlen)
    if model.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(model.device)
        # Blocks torch's allocator holds but no tensor uses (a previous engine's slots) are free to this one too.
        free += torch.cuda.memory_reserved(model.device) - torch.cuda.memory_allocated(model.device)
        per_slot = state + vocoder_bytes(vocoder_batching, vocoder_frames)
        usable = free * (1 - headroom) - 2 * 2**30 - staging * state
        where = "of the GPU is free"
    else:
        free = _host_available()
        if free is None:
            return
        per_slot = state
        usable = free * (1 - headroom) - staging * state
        where = "of host memory is available"
    if slots * per_slot > usable:
        fits = max(int(usable // per_slot), 0)
        raise ZonosInputError(
            f"{slots} slots of {max_seqlen} tokens need {slots * per_slot / 2**30:.1f} GiB with their streams' vocoder "
            f"state, and {free / 2**30:.1f} GiB {where}: at most {fits} slots fit at this max_seqlen (or lower "
            "max_seqlen)"
        )
