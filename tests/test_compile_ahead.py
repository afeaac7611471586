"""The compile-ahead recorder (zonos_accel/compile_ahead.py) through the hook interface Triton calls it with: what it
skips, what it hands to the compile threads (once per kernel specialization), what it leaves to other work, and
what it loads afterwards. The hook's arguments are as Triton's JIT passes them; the kernels are stand-ins (a real
compile needs a GPU: the warm-up's GPU tests run it)."""

from __future__ import annotations

import threading
import types

import pytest
import torch

pytest.importorskip("triton")
from triton import knobs  # noqa: E402

from zonos_accel.compile_ahead import KernelRecorder, default_workers  # noqa: E402

CPU = torch.device("cpu")  # the stand-in kernels need no device context


class _Kernel:
    def __init__(self):
        self.loads = 0

    def _init_handles(self):
        self.loads += 1


class _Jit:
    """Stands for a JITFunction: ``preload`` returns a compiled kernel (or raises, as a failed compile does)."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.preloaded: list[str] = []
        self.kernels: list[_Kernel] = []
        self.threads: set[str] = set()

    def preload(self, data: str) -> _Kernel:
        self.threads.add(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("compile failed")
        self.preloaded.append(data)
        self.kernels.append(_Kernel())
        return self.kernels[-1]


def _launch(name: str, jit: _Jit, key: str, warmup: bool = False):
    """What Triton's JIT does on a launch that finds no compiled kernel: call the hook (True skips it)."""
    hook = knobs.runtime.jit_cache_hook
    info = types.SimpleNamespace(module=None, name=name, jit_function=jit)
    compile = {"key": key, "specialization_data": f"{name}:{key}"}
    return hook(key=key, repr=name, fn=info, compile=compile, is_manual_warmup=warmup, already_compiled=False)


def test_launches_on_the_recorded_thread_are_skipped_and_compiled_once_each():
    conv, norm = _Jit(), _Jit()
    names = []
    before = knobs.runtime.jit_cache_hook
    with KernelRecorder(lambda: True, CPU, workers=3, on_kernel=names.append) as recorder:
        assert _launch("conv", conv, "a") is True
        assert _launch("conv", conv, "a") is True  # the same specialization again: no second compile
        assert _launch("conv", conv, "b") is True
        assert _launch("norm", norm, "a") is True
    assert knobs.runtime.jit_cache_hook is before
    compiled, failed = recorder.finish()
    assert (compiled, failed) == (3, 0) and names == ["conv", "conv", "norm"]
    assert sorted(conv.preloaded) == ["conv:a", "conv:b"] and norm.preloaded == ["norm:a"]
    assert all(k.loads == 1 for k in conv.kernels + norm.kernels)  # each loaded after its compile
    assert conv.threads | norm.threads <= {f"zonos-compile_{i}" for i in range(3)}


def test_other_work_and_preloads_compile_as_usual_through_the_previous_hook():
    seen = []

    def previous(*, fn, **kwargs):
        seen.append(fn.name)
        return None

    jit = _Jit()
    knobs.runtime.jit_cache_hook = previous
    try:
        with KernelRecorder(lambda: False, CPU, workers=1) as recorder:
            assert _launch("other", jit, "a") is None  # not the recorded work: compiled and launched as usual
        with KernelRecorder(lambda: True, CPU, workers=1):
            assert _launch("preload", jit, "a", warmup=True) is None  # a pool thread's preload: compile it
        assert knobs.runtime.jit_cache_hook is previous
    finally:
        knobs.runtime.jit_cache_hook = None
    assert seen == ["other", "preload"] and jit.preloaded == []
    assert recorder.finish() == (0, 0)


def test_a_failed_compile_is_left_to_the_first_launch():
    good, bad = _Jit(), _Jit(fail=True)
    with KernelRecorder(lambda: True, CPU, workers=2) as recorder:
        _launch("good", good, "a")
        _launch("bad", bad, "a")
    assert recorder.finish() == (1, 1)


def test_with_processes_each_specialization_goes_to_a_process_then_preloads_on_a_thread(monkeypatch):
    """Recorded launches go to the compile processes (module, name, specialization); finish waits for them, then
    preloads every kernel on the threads (from the cache, or compiling there what a process failed to) and loads it."""
    from concurrent.futures import Future

    from zonos_accel import compile_worker

    submitted = []

    class Processes:
        def __init__(self, count, cache_dir):
            self.count, self.closed = count, False

        def submit(self, module, qualname, data):
            submitted.append((module, qualname, data))
            future = Future()
            if qualname == "bad":
                future.set_exception(RuntimeError("compile failed in the process"))
            else:
                future.set_result(qualname)
            return future

        def shutdown(self):
            self.closed = True

    monkeypatch.setattr(compile_worker, "CompileProcesses", Processes)
    conv, bad = _Jit(), _Jit()
    with KernelRecorder(lambda: True, CPU, workers=2, processes=3) as recorder:
        _launch("conv", conv, "a")
        _launch("conv", conv, "a")
        _launch("bad", bad, "a")
        assert conv.preloaded == [] and bad.preloaded == []  # nothing compiles in this process while recording
    assert submitted == [(None, "conv", "conv:a"), (None, "bad", "bad:a")]
    assert recorder.finish() == (2, 0)
    assert conv.preloaded == ["conv:a"] and bad.preloaded == ["bad:a"]  # the failed one compiled on a thread
    assert all(k.loads == 1 for k in conv.kernels + bad.kernels)


def test_a_compile_process_fills_the_cache_the_recording_process_then_hits(tmp_path, monkeypatch):
    """A real specialization (Triton's own serialization of a launch of one of our kernels, for sm_90) compiled in a
    compile process lands under the cache key this process computes: its compile afterwards writes nothing new. A
    specialization the compiler refuses comes back as the process's error. Needs no GPU."""
    import os

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import serialize_specialization_data

    from zonos_accel.compile_worker import CompileProcesses
    from zonos_accel.triton.activations import _silu_mul_kernel as kernel

    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path))
    target = GPUTarget("cuda", 90, 32)
    names = kernel.arg_names
    constants = {(names.index("BLOCK"),): 1024, (names.index("GDC"),): False}
    signature = {n: "constexpr" if (names.index(n),) in constants else ("*bf16" if n.endswith("_ptr") else "i32")
                 for n in names}  # fmt: skip
    attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    options = make_backend(target).parse_options({"num_warps": 4})
    data = serialize_specialization_data("silu_mul", signature, constants, attrs, options, "key", target)
    processes = CompileProcesses(1, str(tmp_path))
    try:
        module, qualname = kernel.fn.__module__, kernel.fn.__qualname__
        assert processes.submit(module, qualname, data).result(timeout=300) == "silu_mul"
        refused = processes.submit(module, qualname, data.replace('"*bf16"', '"*nonsense"'))
        with pytest.raises(RuntimeError):
            refused.result(timeout=300)
    finally:
        processes.shutdown()
    files = sorted(p for _, _, ps in os.walk(tmp_path) for p in ps)
    assert files
    rebuilt = make_backend(target).parse_options({k: tuple(v) if isinstance(v, list) else v
                                                  for k, v in options.__dict__.items()})  # fmt: skip
    triton.compile(ASTSource(kernel, signature, constants, attrs), target=target, options=rebuilt.__dict__)
    assert sorted(p for _, _, ps in os.walk(tmp_path) for p in ps) == files  # a cache hit: nothing compiled


def test_default_workers_is_the_usable_cores():
    assert 1 <= default_workers() <= 32


# ---- the warm-up's pass (Zonos._compile_ahead) on a tiny CPU model: a kernel "launched" from the engine's thread


@pytest.fixture
def tiny(tmp_path):
    from tests.tiny import tiny_model

    model = tiny_model(tmp_path)
    model.start_engine(slots=3, queue_size=5, vocoder_frames=2)
    return model


def _dry_run(model, launches: list[str]):
    """A streamed request whose logits processor, on the engine's thread, makes the launches Triton would make."""
    jit = _Jit()

    def processor(logits, step):
        for key in launches:
            _launch("k", jit, key)
        return logits

    prefix = torch.randn(2, 12, model.config.backbone.d_model)
    stream = model.generate(prefix, max_new_tokens=4, stream=True, logits_processor=processor, progress_bar=False)
    return jit, lambda: list(stream)


def test_the_pass_replaces_the_engine_when_it_skipped_a_kernel(tiny):
    from tqdm import tqdm

    old = tiny.engine
    jit, run = _dry_run(tiny, ["a", "a", "b"])
    tiny._compile_ahead(run, tqdm(disable=True), 2)
    new = tiny.engine
    assert new is not old and sorted(jit.preloaded) == ["k:a", "k:b"]
    assert (new.slots.count, new.max_seqlen, new.queue_size, new.vocoder_frames) == (3, old.max_seqlen, 5, 2)
    jit, run = _dry_run(tiny, [])
    run()  # the new engine serves requests


def test_the_pass_keeps_the_engine_when_nothing_was_skipped(tiny):
    from tqdm import tqdm

    old = tiny.engine
    jit, run = _dry_run(tiny, [])
    tiny._compile_ahead(run, tqdm(disable=True), 2)
    assert tiny.engine is old and jit.preloaded == []
