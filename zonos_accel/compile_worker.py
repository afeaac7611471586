"""Compile recorded Triton kernel specializations in processes of their own, for the GPU they were recorded on, into
Triton's disk cache: :class:`CompileProcesses`, what :class:`zonos_accel.compile_ahead.KernelRecorder` runs with
``processes``.

A process shares no interpreter lock with the one that recorded the launch, and needs no GPU: Triton compiles for a
named target. The specialization is the JSON that Triton's ``jit_cache_hook`` hands the recorder (its
``specialization_data``, what ``JITFunction.preload`` reads). Compiled here from the same source, constants,
attributes, options and target, the kernel lands in the cache under the key the recording process computes, so its
``preload`` afterwards is a cache hit (it loads the binary and compiles nothing).

The processes are ``python -m zonos_accel.compile_worker``, fed one specialization at a time over a pipe (a JSON line
each way), not multiprocessing's: those re-import the caller's main script in every process, which a script
without a ``__main__`` guard would run again.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future


class CompileProcesses:
    """``count`` compile processes sharing the Triton cache directory ``cache_dir``; :meth:`submit` queues a
    specialization and returns a Future of the kernel's name (or of the compiler's error)."""

    def __init__(self, count: int, cache_dir: str):
        self._jobs: queue.Queue = queue.Queue()
        env = {**os.environ, "TRITON_CACHE_DIR": cache_dir}
        command = [sys.executable, "-m", "zonos_accel.compile_worker"]
        self._processes = [
            subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(count)
        ]
        self._feeders = [threading.Thread(target=self._feed, args=(p,), daemon=True) for p in self._processes]
        for t in self._feeders:
            t.start()

    def submit(self, module: str, qualname: str, data: str) -> Future:
        future: Future = Future()
        self._jobs.put((future, module, qualname, data))
        return future

    def _feed(self, process: subprocess.Popen) -> None:
        while (job := self._jobs.get()) is not None:
            future, module, qualname, data = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                process.stdin.write(json.dumps([module, qualname, data]) + "\n")
                process.stdin.flush()
                line = process.stdout.readline()
                if not line:
                    raise RuntimeError(f"the compile process exited (status {process.poll()})")
                reply = json.loads(line)
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                future.set_result(reply["name"])
            except Exception as e:  # noqa: BLE001 - the kernel is left to compile at its first launch
                future.set_exception(e)

    def shutdown(self) -> None:
        """Let the queued specializations finish, then end the processes."""
        for _ in self._feeders:
            self._jobs.put(None)
        for t in self._feeders:
            t.join()
        for p in self._processes:
            p.stdin.close()
            p.wait()


def jit_function(module: str, qualname: str):
    """The JITFunction named ``module``:``qualname`` (through autotuning or heuristics wrappers)."""
    from triton.runtime.jit import JITFunction

    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction):
        obj = obj.fn  # an Autotuner or Heuristics wraps the JITFunction as .fn
    return obj


def _tuples(value):
    """JSON's lists back to the tuples Triton's signatures and constants hold."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _constant(value):
    import triton.language as tl

    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict) and "constexpr" in value:
        return tl.constexpr(_tuples(value["constexpr"]))
    if isinstance(value, dict) and "jit_function" in value:
        module, qualname = value["jit_function"].split(":")
        return jit_function(module, qualname)
    return _tuples(value)


def compile_specialization(module: str, qualname: str, data: str) -> str:
    """Compile the kernel ``module``:``qualname`` for the specialization ``data`` (Triton's JSON) into Triton's disk
    cache; returns the kernel's name. Raises what the compiler raises."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    spec = json.loads(data)
    fn = jit_function(module, qualname)
    target = GPUTarget(**{key: _tuples(value) for key, value in spec["target"].items()})
    constants = {tuple(key): _constant(value) for key, value in zip(spec["constant_keys"], spec["constant_vals"])}
    attrs = {tuple(key): value for key, value in zip(spec["attrs_keys"], spec["attrs_vals"])}
    signature = {name: _tuples(kind) for name, kind in spec["signature"].items()}
    # Options back as preload rebuilds them (lists one level deep become tuples): their hash is in the cache key.
    options = {key: tuple(v) if isinstance(v, list) else v for key, v in spec["options"].items()}
    options = make_backend(target).parse_options(options)
    triton.compile(ASTSource(fn, signature, constants, attrs), target=target, options=options.__dict__)
    return spec["name"]


def main() -> None:
    """A compile process: one JSON line [module, qualname, specialization] in, one {"name"} or {"error"} line out."""
    replies = sys.stdout
    sys.stdout = sys.stderr  # anything else printed goes to stderr, off the reply pipe
    for line in sys.stdin:
        module, qualname, data = json.loads(line)
        try:
            reply = {"name": compile_specialization(module, qualname, data)}
        except Exception as e:  # noqa: BLE001 - reported to the recorder, which leaves the kernel to its first launch
            reply = {"error": f"{type(e).__name__}: {e}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
