"""Compile the Triton kernels a piece of work will launch on many threads (or processes) at once, before it runs.

Triton compiles a kernel when it is first launched, on the launching thread, one kernel after the other: on a
machine with empty kernel caches the model's first request spends tens of seconds there (docs/BENCHMARKS.md,
first request). The compiler spends most of that time in LLVM and ptxas, which release the interpreter lock, so
compiles run in parallel on threads. :class:`KernelRecorder` finds what to compile without compiling: while it is
active, a launch of a kernel that is not compiled yet is skipped, and its specialization (what Triton's
``jit_cache_hook`` reports) is handed to a thread pool that compiles it through ``JITFunction.preload``, which
puts it where the launch will look (the kernel's in-memory cache and Triton's disk cache).

With ``processes``, the compiles run in compile processes instead (:mod:`zonos_accel.compile_worker`), which share
no interpreter lock: each writes its kernel to Triton's disk cache, and :meth:`KernelRecorder.finish` preloads it
from there on the threads (a cache hit); a kernel a process fails to compile is compiled on a thread instead.

A recorded run is a dry run: the skipped kernels write nothing, so what they would have written holds stale
memory, and anything captured meanwhile (CUDA graphs) is missing them. The caller runs work whose host-side
control flow does not depend on those values, throws away what it captured, and then runs the work for real,
every launch finding its kernel compiled. :meth:`KernelRecorder.finish` waits for the compiles and loads each
kernel onto the device (its module and launcher), also on the pool: that must wait until no CUDA graph is being
captured, because loading a module breaks a capture running on another thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

__all__ = ["KernelRecorder", "default_workers"]


def default_workers() -> int:
    """Compile threads: one per CPU core this process may use, at most 32."""
    return max(1, min(32, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


class KernelRecorder:
    """While entered (``with``), Triton launches that would compile are skipped and their kernels compiled on
    ``workers`` threads (with ``processes`` > 0: in that many compile processes, then preloaded from the kernel cache
    on the threads); :meth:`finish` then waits for them and loads them. Only launches for which ``recording()``
    is true on the launching thread are skipped (say, the thread of the work being recorded), so other work in the
    process runs as usual. ``on_kernel(name)`` is called on the launching thread for each kernel found (e.g. to
    show it on a progress bar). Kernels that fail to compile here are left to compile at their first real launch
    (and fail there, with the compiler's error)."""

    def __init__(
        self, recording: Callable[[], bool], device, workers: int | None = None, on_kernel=None, processes: int = 0
    ):
        self.recording = recording
        self.device = device  # the torch.device the work runs on: kernels compile for it and load onto it
        self.workers = workers or default_workers()
        self.processes = processes  # compile processes (0: compile on the threads)
        self.on_kernel = on_kernel
        self.found: dict[tuple, str] = {}  # (kernel, specialization key) -> kernel name
        self._futures: list[Future] = []
        self._compiled_apart: list[tuple] = []  # (JITFunction, specialization, Future of its compile process)
        self._pool: ThreadPoolExecutor | None = None
        self._compilers = None
        self._previous = None
        self._lock = threading.Lock()

    def __enter__(self) -> KernelRecorder:
        from triton import knobs

        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="zonos-compile")
        if self.processes:
            from zonos_accel.compile_worker import CompileProcesses

            self._compilers = CompileProcesses(self.processes, knobs.cache.dir)  # started now: they import meanwhile
        self._previous = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = self._hook
        return self

    def __exit__(self, *exc) -> None:
        from triton import knobs

        knobs.runtime.jit_cache_hook = self._previous

    def _hook(self, *, key, fn, compile, is_manual_warmup, **kwargs):
        if is_manual_warmup or not self.recording():  # preload's own compile (a pool thread), or other work
            if self._previous is None:
                return None
            return self._previous(key=key, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup, **kwargs)
        ident = (id(fn.jit_function), str(key))
        with self._lock:
            if ident not in self.found:
                self.found[ident] = fn.name
                data = compile["specialization_data"]
                if self._compilers is not None:
                    apart = self._compilers.submit(fn.module, fn.name, data)
                    self._compiled_apart.append((fn.jit_function, data, apart))
                else:
                    self._futures.append(self._pool.submit(self._compile, fn.jit_function, data))
                if self.on_kernel is not None:
                    self.on_kernel(fn.name)
        return True  # skip the compile and the launch

    def _on_device(self):
        import torch

        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def _compile(self, jit_function, specialization_data: str):
        with self._on_device():  # preload compiles for, and caches under, the thread's current device
            kernel = jit_function.preload(specialization_data)
        return kernel.result() if hasattr(kernel, "result") else kernel  # a FutureKernel under AsyncCompileMode

    def finish(self) -> tuple[int, int]:
        """Wait for every compile, then load the kernels onto the device on the pool; shuts the pool down. Returns
        (kernels compiled, kernels that failed and will compile at their first launch)."""
        if self._pool is None:
            return 0, 0
        if self._compilers is not None:
            # Each process's kernel is in the disk cache by now (or failed there): preload it from there, or compile
            # it, on the threads.
            wait([apart for _, _, apart in self._compiled_apart])
            self._compilers.shutdown()
            self._compilers = None
            self._futures += [self._pool.submit(self._compile, jit, data) for jit, data, _ in self._compiled_apart]
        done, _ = wait(self._futures)
        kernels = [f.result() for f in done if f.exception() is None]
        failed = len(done) - len(kernels)

        def load(kernel) -> None:
            init = getattr(kernel, "_init_handles", None)  # module load and launcher build: else at first launch
            if init is None:
                return
            with self._on_device():
                try:
                    init()
                except Exception:  # noqa: BLE001 - e.g. out of shared memory: the first launch raises it again
                    pass

        list(self._pool.map(load, kernels))
        self._pool.shutdown()
        self._pool = None
        return len(kernels), failed
