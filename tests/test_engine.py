"""The engine's request slots on tiny float64 models (CPU): requests decoded side by side, joining and leaving at
different steps, give exactly the codes and streamed audio they give alone; cancelling frees a slot and leaves
the others unchanged; concurrent use of one model (interleaved iterators, a one-shot call while a stream is open,
threads) is correct; a full queue, an over-long request, an abandoned iterator and a shut-down engine behave."""

import gc
import threading

import pytest
import torch

from tests.test_model import _prefix
from tests.tiny import tiny_model
from zonos.conditioning import make_cond_dict
from zonos.engine import Engine
from zonos.errors import EngineClosedError, EngineFullError, ZonosInputError
from zonos.ops.backend import REFERENCE


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    m = tiny_model(tmp_path_factory.mktemp("engine"), dtype=torch.float64, max_seqlen=160)
    m.autoencoder.dac.double()
    m.start_engine(slots=4)
    return m


TEXTS = ["Hello there.", "A second, longer sentence to speak.", "Three!", "Numbers: 12 and 7."]
SETTINGS = [
    dict(max_new_tokens=30),
    dict(max_new_tokens=22, sampling_params={"temperature": 0.8, "top_k": 50, "repetition_penalty": 2.0}),
    dict(max_new_tokens=26, cfg_scale=1.0, sampling_params={"top_p": 0.9, "min_p": 0.0}),
    dict(max_new_tokens=18, sampling_params={"linear": 0.6, "conf": 0.2, "quad": 0.1, "repetition_penalty_window": 4}),
]


@pytest.fixture(scope="module")
def prefixes(model):
    return [_prefix(model, text) for text in TEXTS]


def _kwargs(i, **extra):
    return dict(SETTINGS[i], progress_bar=False, generator=torch.Generator().manual_seed(100 + i), **extra)


@pytest.fixture(scope="module")
def solo(model, prefixes):
    """Each request alone: one-shot codes and streamed chunks."""
    out = []
    for i, p in enumerate(prefixes):
        codes = model.generate(p, **_kwargs(i))
        chunks = list(model.generate(p, **_kwargs(i, stream=True, chunk_frames=4)))
        out.append((codes, chunks))
    return out


def _audio(chunks):
    return torch.cat([c.audio for c in chunks], -1)


def test_solo_stream_equals_solo_one_shot(model, solo):
    for codes, chunks in solo:
        assert torch.equal(torch.cat([c.codes for c in chunks], -1), codes)
        ref = model.autoencoder.decode(codes)
        assert torch.allclose(_audio(chunks), ref, rtol=0, atol=1e-9)


def test_requests_joining_at_different_steps_equal_their_solo_runs(model, prefixes, solo):
    """Request 0 starts alone; each callback submits the next request at a chosen step of the running one, so
    they join mid-flight, run in different buckets and leave at different steps."""
    handles = {}
    joins = {0: 3, 1: 5, 2: 2}  # request i submits request i + 1 at its step joins[i]

    def submitter(i):
        def callback(frame, step, max_steps):
            if step == joins.get(i) and i + 1 not in handles:
                handles[i + 1] = model.submit(
                    prefixes[i + 1], **_kwargs(i + 1, stream=i % 2 == 0, chunk_frames=4, callback=submitter(i + 1))
                )
            return True

        return callback

    handles[0] = model.submit(prefixes[0], **_kwargs(0, stream=True, chunk_frames=4, callback=submitter(0)))
    chunks0 = list(handles[0])
    results = {0: chunks0}
    for i in (1, 2, 3):
        h = handles[i]
        results[i] = list(h) if h.request.stream else h.result()
    for i, got in results.items():
        codes, chunks = solo[i]
        if isinstance(got, list):
            assert torch.equal(torch.cat([c.codes for c in got], -1), codes), i
            assert torch.equal(_audio(got), _audio(chunks)), i
        else:
            assert torch.equal(got, codes), i


def test_cancelled_request_frees_its_slot_and_leaves_the_others_alone(model, prefixes, solo):
    other = model.submit(prefixes[1], **_kwargs(1))
    victim = model.submit(prefixes[0], **_kwargs(0, stream=True, chunk_frames=2))
    it = iter(victim)
    next(it)
    victim.cancel()
    assert list(it) == []
    assert torch.equal(other.result(), solo[1][0])
    again = model.generate(prefixes[0], **_kwargs(0))
    assert torch.equal(again, solo[0][0])
    assert not model.engine.busy


def test_interleaved_iterators(model, prefixes, solo):
    a = model.generate(prefixes[0], **_kwargs(0, stream=True, chunk_frames=4))
    b = model.generate(prefixes[3], **_kwargs(3, stream=True, chunk_frames=4))
    got_a, got_b = [], []
    live = {"a": (a, got_a), "b": (b, got_b)}
    while live:  # alternate between the two iterators until both end
        for name in list(live):
            it, got = live[name]
            try:
                got.append(next(it))
            except StopIteration:
                del live[name]
    assert torch.equal(_audio(got_a), _audio(solo[0][1]))
    assert torch.equal(_audio(got_b), _audio(solo[3][1]))
    assert model.engine.vocoding.most_rows >= 2  # pushed together as rows of the engine's slab


def test_slab_streams_equal_decoders_of_their_own_and_the_one_shot_decode(model, prefixes, solo):
    """The slab's streams (the default) against streams on decoders of their own (vocoder_batching=False) and the
    one-shot decode of their codes: the same codes and chunk tiling, the same samples to float64 rounding. On
    decoders of their own, two streams had a vocoder each, back in the engine's pool, both taking weight casts from
    the engine's one."""
    try:
        model.start_engine(slots=4, vocoder_batching=False)
        a = model.generate(prefixes[0], **_kwargs(0, stream=True, chunk_frames=4))
        b = model.generate(prefixes[3], **_kwargs(3, stream=True, chunk_frames=4))
        own = [list(a), list(b)]
        decoders = model.engine._decoders
        assert len(decoders) >= 2 and len({id(d._params.casts) for d in decoders}) == 1
    finally:
        model.start_engine(slots=4)
    for i, chunks in zip([0, 3], own):
        slab = solo[i][1]
        assert torch.equal(torch.cat([c.codes for c in slab], -1), solo[i][0])
        assert torch.equal(torch.cat([c.codes for c in chunks], -1), solo[i][0])
        ref = model.autoencoder.decode(solo[i][0]).double()
        for got in (slab, chunks):
            assert [c.samples[0] for c in got[1:]] == [c.samples[1] for c in got[:-1]]
            assert [c.frames[0] for c in got[1:]] == [c.frames[1] for c in got[:-1]]
            assert got[-1].final and not any(c.final for c in got[:-1])
            audio = _audio(got).double()
            assert audio.shape == ref.shape and torch.allclose(audio, ref, rtol=0, atol=1e-10), i


def test_one_shot_call_while_a_stream_is_open(model, prefixes, solo):
    a = model.generate(prefixes[0], **_kwargs(0, stream=True, chunk_frames=4))
    first = next(a)
    codes = model.generate(prefixes[2], **_kwargs(2))
    rest = list(a)
    assert torch.equal(codes, solo[2][0])
    assert torch.equal(torch.cat([c.codes for c in [first, *rest]], -1), solo[0][0])


def test_two_threads(model, prefixes, solo):
    out = {}

    def run(i):
        out[i] = model.generate(prefixes[i], **_kwargs(i))

    threads = [threading.Thread(target=run, args=(i,)) for i in (1, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.equal(out[1], solo[1][0]) and torch.equal(out[3], solo[3][0])


def test_abandoned_iterator_frees_its_slot(model, prefixes, solo):
    a = model.generate(prefixes[0], **_kwargs(0, stream=True, chunk_frames=2))
    next(a)
    del a
    gc.collect()
    assert torch.equal(model.generate(prefixes[1], **_kwargs(1)), solo[1][0])
    for _ in range(200):
        if not model.engine.busy:
            break
        threading.Event().wait(0.01)
    assert not model.engine.busy


def test_bad_requests(model, prefixes, tmp_path):
    with pytest.raises(ZonosInputError, match="max_seqlen"):
        model.generate(prefixes[0], max_new_tokens=150, progress_bar=False)
    gate = threading.Event()
    busy = model.submit(prefixes[0], max_new_tokens=12, callback=lambda *a: gate.wait(30))
    try:
        with pytest.raises(ZonosInputError, match="slots"):  # a busy engine is not resized under its requests
            model.generate(prefixes[0], max_new_tokens=4, batch_size=5, progress_bar=False)
    finally:
        gate.set()
        busy.result()
    bad_args = (dict(slots=0), dict(slots=True), dict(queue_size=-1), dict(queue_size=0), dict(vocoder_streams=0),
                dict(vocoder_batching=1), dict(max_seqlen=-1), dict(max_seqlen="100"))  # fmt: skip
    for bad in bad_args:
        with pytest.raises(ZonosInputError, match="must be a"):
            Engine(model, **bad)
    with pytest.raises(ZonosInputError, match="callback must be a function"):
        model.generate(prefixes[0], max_new_tokens=4, callback=5, progress_bar=False)
    with pytest.raises(ZonosInputError, match="logits_processor must be a function"):
        model.generate(prefixes[0], max_new_tokens=4, logits_processor=5, progress_bar=False)
    with pytest.raises(ZonosInputError, match=r"must return float logits of the shape it is given \(1, 9, 1026\)"):
        model.generate(prefixes[0], max_new_tokens=4, logits_processor=lambda logits, step: None, progress_bar=False)
    assert model.generate(prefixes[0], max_new_tokens=4, progress_bar=False).shape[:2] == (1, 9)  # still serving
    small = Engine(model, slots=1, queue_size=1)
    gate = threading.Event()

    def request(**kw):
        return model._request(prefixes[0], None, 12, 2.0, 1, None, None, **kw)

    try:
        running = small.submit(request(callback=lambda *a: gate.wait(30)))  # holds the only slot until the gate opens
        for _ in range(1000):
            if small.active:
                break
            threading.Event().wait(0.01)
        queued = small.submit(request())
        with pytest.raises(EngineFullError, match="queue is full"):
            small.submit(request())
        gate.set()
        assert running.result().shape[:2] == (1, 9) and queued.result().shape[:2] == (1, 9)
    finally:
        gate.set()
        small.shutdown()
    with pytest.raises(EngineClosedError, match="shut down"):
        small.submit(request())


def test_an_idle_engine_grows_for_a_large_batch(tmp_path, prefixes):
    m = tiny_model(tmp_path, dtype=torch.float64, max_seqlen=160)
    m.start_engine(slots=2, queue_size=5, vocoder_streams=2, vocoder_batching=True)
    codes = m.generate(prefixes[0], max_new_tokens=6, batch_size=3, progress_bar=False)
    engine = m.engine
    assert codes.shape[0] == 3 and engine.slots.count == 3
    assert (engine.queue_size, engine.vocoder_streams, engine.vocoder_batching) == (5, 2, True)  # kept


def test_backend_switch_takes_effect_at_the_next_request(model, prefixes, solo):
    """The ops a request runs come from the model's backend object: swapping it (what use_accelerators does) is
    seen by the next request, and nothing process-wide changes."""
    calls = []

    def counting_linear(x, w, b=None):
        calls.append(1)
        return REFERENCE.linear(x, w, b)

    model.set_backend(REFERENCE.replace("counting", linear=counting_linear))
    try:
        codes = model.generate(prefixes[0], **_kwargs(0))
    finally:
        model.set_backend(REFERENCE)
    assert calls and torch.equal(codes, solo[0][0])
    n = len(calls)
    model.generate(prefixes[0], **_kwargs(0))
    assert len(calls) == n


def test_vocoder_batching_gives_each_stream_its_solo_audio(model, prefixes):
    """Concurrent streams joining at different steps (so at different frames of the slab's pushes) are decoded as
    rows of one slab, each row draining after its stream's end: each stream's codes and audio equal the stream
    alone, exactly (float64). A stream cancelled mid-way leaves the others as they would be alone; after a backend
    switch the slab's pushes run the new backend's convs."""
    long = dict(max_new_tokens=60, stream=True, chunk_frames=4)
    alone = [list(model.generate(p, **_kwargs(i, **long))) for i, p in enumerate(prefixes)]
    engine = model.start_engine(slots=4)
    try:
        handles = {}

        def submitter(i):
            def callback(frame, step, total):
                if step == 3 * i + 2 and i + 1 < len(prefixes) and i + 1 not in handles:
                    handles[i + 1] = model.submit(prefixes[i + 1], **_kwargs(i + 1, callback=submitter(i + 1), **long))
                return True

            return callback

        handles[0] = model.submit(prefixes[0], **_kwargs(0, callback=submitter(0), **long))
        got = {}
        while len(got) < len(prefixes):
            for i in [i for i in list(handles) if i not in got]:
                got[i] = list(handles[i])
        for i in range(len(prefixes)):
            codes = torch.cat([c.codes for c in got[i]], -1)
            assert torch.equal(codes, torch.cat([c.codes for c in alone[i]], -1)), i
            assert torch.equal(_audio(got[i]), _audio(alone[i])), i
        vocoding = engine.vocoding
        assert vocoding.most_rows == len(prefixes)  # at some tick all four streams pushed together
        assert not vocoding.members and not engine.busy  # all drained
        # A stream cancelled mid-way: the other rows go on as they would alone.
        victim = model.submit(prefixes[1], **_kwargs(1, **long))
        other = model.submit(prefixes[0], **_kwargs(0, **long))
        it, before = iter(victim), vocoding.pushes
        next(it)
        assert vocoding.pushes > before
        victim.cancel()
        assert torch.equal(_audio(list(other)), _audio(alone[0]))
        assert not vocoding.members and not engine.busy
        # A backend switch: the slab's next pushes run the new backend's convs.
        calls = []

        def counting_conv1d(*args, **kwargs):
            calls.append(1)
            return REFERENCE.conv1d(*args, **kwargs)

        switched = REFERENCE.replace("counting", conv1d=counting_conv1d)
        model.set_backend(switched)
        pushes = vocoding.pushes
        assert torch.equal(_audio(list(model.generate(prefixes[0], **_kwargs(0, **long)))), _audio(alone[0]))
        assert vocoding.pushes > pushes and calls and vocoding.slab.decoder._stages[0].ops is switched
    finally:
        model.set_backend(REFERENCE)
        model.start_engine(slots=4)


def test_warmup_refuses_a_prefix_past_the_slots_before_allocating(model):
    import time

    t0 = time.perf_counter()
    with pytest.raises(ZonosInputError, match="warmup's prefix_length 1000000"):
        model.warmup(prefix_length=10**6, progress_bar=False)
    assert time.perf_counter() - t0 < 0.5  # the random prefix alone took 2.5 s
    with pytest.raises(ZonosInputError, match="compile_processes must be an int ≥ 0, got -1"):
        model.warmup(compile_processes=-1, progress_bar=False)


def test_warmup_runs_streams_together(model):
    """``warmup(streams=3)`` runs 1, 2 and 3 streams at a time (each count twice, as graphs capture at a shape's
    second occurrence), long enough for them to reach the vocoder bank together, and leaves the engine idle;
    asking for more streams than slots is refused before any work."""
    engine = model.start_engine(slots=4, vocoder_batching=True)
    try:
        with pytest.raises(ZonosInputError, match="slots"):
            model.warmup(prefix_length=8, streams=5, progress_bar=False)
        model.warmup(prefix_length=8, frames=10, first_chunk_frames=1, chunk_frames=4, streams=3, progress_bar=False)
        assert engine.vocoding.most_rows == 3 and engine.steps > 0 and not engine.busy
    finally:
        model.start_engine(slots=4)


def test_warmup_runs_the_requests_logits_processor(model):
    """``warmup(logits_processor=fn)`` runs its requests with ``fn`` (the step graphs are keyed by it), at every
    step of every stream."""
    seen = []

    def processor(logits, step):
        seen.append(logits.shape[0])
        return logits

    model.warmup(prefix_length=8, frames=6, streams=2, progress_bar=False, logits_processor=processor)
    assert seen and set(seen) <= {1, 2}


def test_memory_plan_counts_the_vocoders(model, monkeypatch):
    """The start-up memory check counts each slot's decode state and its stream's vocoder state (a decoder of its
    own; with vocoder_batching its slab row too): a GPU with room for the decode state alone is refused, naming how
    many slots fit."""
    from types import SimpleNamespace

    from zonos.engine import check_memory, slot_bytes
    from zonos.engine.engine import vocoder_bytes

    gpu = SimpleNamespace(device=torch.device("cuda"), backbone=model.backbone)
    state = slot_bytes(model, 160)
    free = (2 * 2**30 + 9 * state + 4 * vocoder_bytes(False)) / 0.9  # the staging row, 8 slots, 4 vocoders
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free), int(free)))
    for counter in ("memory_reserved", "memory_allocated"):  # nothing cached (this process may have used a GPU)
        monkeypatch.setattr(torch.cuda, counter, lambda device=None: 0)
    check_memory(gpu, 4, 160, vocoder_batching=False)  # 4 slots with their vocoders fit
    with pytest.raises(ZonosInputError, match=r"8 slots of 160 tokens need .* at most 4 slots fit"):
        check_memory(gpu, 8, 160, vocoder_batching=False)
    with pytest.raises(ZonosInputError, match="at most 3 slots fit"):
        check_memory(gpu, 4, 160)  # a slab row each too (7.2 MiB at 4 frames per push, beside 28 MiB)
    assert vocoder_bytes(True) - vocoder_bytes(False) == vocoder_bytes(True, 4) - vocoder_bytes(False) > 0


def test_a_restarted_engine_checks_its_memory_after_the_old_one_is_freed(model, monkeypatch):
    """start_engine frees the engine it replaces before the new one checks what fits: at many slots the two
    engines' state would not fit at once, yet one of them does."""
    import weakref

    from zonos.engine import engine as engine_module

    old = weakref.ref(model.start_engine(slots=2))
    real = engine_module.check_memory
    seen = []

    def check(*args, **kwargs):
        seen.append(old())
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "check_memory", check)
    model.start_engine(slots=3)
    assert seen == [None]
    monkeypatch.undo()
    model.start_engine()


def test_cached_free_gpu_blocks_count_as_free(model, monkeypatch):
    """Memory torch's allocator keeps reserved but unused (a freed engine's slots) counts toward what fits."""
    from types import SimpleNamespace

    from zonos.engine import check_memory, slot_bytes
    from zonos.engine.engine import vocoder_bytes

    gpu = SimpleNamespace(device=torch.device("cuda"), backbone=model.backbone)
    per_slot = slot_bytes(model, 160) + vocoder_bytes(True)
    need = (2 * 2**30 + 5 * per_slot) / 0.9  # the staging row and 4 slots, with room to spare
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(need / 2), int(need)))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: int(need))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: int(need / 2))
    check_memory(gpu, 4, 160)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: int(need))  # all of it in use
    with pytest.raises(ZonosInputError, match="at most 0 slots fit"):
        check_memory(gpu, 4, 160)


def test_slots_past_host_memory_are_refused_on_the_cpu(model):
    """generate(batch_size=B) grows an idle engine to B slots: on the CPU a B past the host's memory is refused
    with how many fit, instead of the allocator's error."""
    from zonos.engine import check_memory
    from zonos.engine.engine import _host_available

    if _host_available() is None:
        pytest.skip("this system does not say how much memory is available")
    with pytest.raises(ZonosInputError, match=r"of host memory is available: at most \d+ slots fit"):
        check_memory(model, 10**7, 160)
    prefix = model.prepare_conditioning(make_cond_dict(text="Hi there.", device="cpu"))
    with pytest.raises(ZonosInputError, match=r"batch_size must be an integer in \[1, 65536\]"):
        model.generate(prefix, max_new_tokens=2, batch_size=10**7, progress_bar=False)  # before drawing its seeds
    assert model.generate(prefix, max_new_tokens=2, progress_bar=False).shape[:2] == (1, 9)


def test_bad_engine_arguments_leave_the_running_engine_alone(model, prefixes):
    """start_engine checks its arguments before it shuts the previous engine down: an open stream keeps going."""
    engine = model.engine
    stream = model.generate(prefixes[0], max_new_tokens=12, stream=True, progress_bar=False, first_chunk_frames=1)
    first = next(stream)
    for bad in (dict(max_seqlen=0), dict(queue_size=0), dict(slots=-1)):
        with pytest.raises(ZonosInputError, match="must be"):
            model.start_engine(**bad)
    assert model.engine is engine
    chunks = [first, *stream]  # (the first chunk may be the whole stream: it waits for audio at the CPU's pace)
    assert chunks[-1].final and first.frames[0] == 0 and chunks[-1].frames[1] == 12


def test_queue_size_counts_only_requests_the_free_slots_cannot_take(model, prefixes):
    """Requests queued while the worker is busy do not count against ``queue_size`` while free slots can take them:
    with 8 free slots and a queue of 1, nine submits are accepted (eight go to slots at the worker's next iteration)
    and the tenth is refused; every accepted one then finishes."""
    engine = Engine(model, slots=8, queue_size=1)

    def request():
        return model._request(prefixes[0], None, 4, 2.0, 1, None, None)

    try:
        with engine.idle():  # the worker waits: everything submitted stays queued
            handles = [engine.submit(request()) for _ in range(9)]
            assert engine.queued == 9
            with pytest.raises(EngineFullError, match="queue is full"):
                engine.submit(request())
        for h in handles:
            assert h.result(timeout=60).shape[:2] == (1, 9)
    finally:
        engine.shutdown()


def test_state_serials_are_never_reused(model):
    """CUDA graphs are keyed by the state they were captured on: a state allocated where a freed one lived (the
    same ``id``) still gets a new serial."""
    seen = set()
    for _ in range(20):
        state = model.backbone.allocate_inference_state(2, 8)
        assert state.serial not in seen
        seen.add(state.serial)
        del state


def test_eos_at_the_prefill_token_ends_stream_and_one_shot_alike(model, prefixes):
    """The prefill's sampled token is covered by the slots' EOS flags (the steps' flags are not): EOS there ends the
    stream where it ends the one-shot result, with no frame after it."""

    def eos_first(logits, step):
        out = logits.clone()
        out[:, 0, model.eos_token_id] = torch.where(step[:, None] == 0, 1e4, out[:, 0, model.eos_token_id, None])[:, 0]
        return out

    kw = dict(max_new_tokens=20, progress_bar=False, logits_processor=eos_first)
    codes = model.generate(prefixes[0], generator=torch.Generator().manual_seed(1), **kw)
    chunks = list(model.generate(prefixes[0], generator=torch.Generator().manual_seed(1), stream=True, **kw))
    streamed = torch.cat([c.codes for c in chunks], -1)
    assert codes.shape[-1] == 0 and torch.equal(streamed, codes)


def _request(model, prefixes, i, **extra):
    """Request ``i`` of the solo fixture's, for an engine other than the model's."""
    kw = _kwargs(i, **extra)
    kw.pop("progress_bar")
    return model._request(
        prefixes[i], None, kw.pop("max_new_tokens"), kw.pop("cfg_scale", 2.0), 1, kw.pop("sampling_params", None),
        kw.pop("generator"), **kw,
    )  # fmt: skip


def _result(handle):
    if handle.request.stream:
        chunks = list(handle)
        return torch.cat([c.codes for c in chunks], -1), _audio(chunks)
    return handle.result(), None


def _check_solo(got, solo_run):
    codes, chunks = solo_run
    assert torch.equal(got[0], codes)
    if got[1] is not None:
        assert torch.equal(got[1], _audio(chunks))


def test_requests_queued_together_prefill_in_one_batch_and_equal_their_solo_runs(model, prefixes, solo):
    """Four requests of unequal prefix lengths and settings, queued while the worker waits: one batched prefill
    (rows padded to the longest prefix) loads all four slots, and each gives exactly its solo codes and audio."""
    engine = model.engine
    batches = engine.join_batches
    with engine.idle():
        handles = [model.submit(prefixes[i], **_kwargs(i, stream=i % 2 == 1, chunk_frames=4)) for i in range(4)]
    for i, h in enumerate(handles):
        _check_solo(_result(h), solo[i])
    assert engine.join_batches == batches + 1
    assert len({p.shape[1] for p in prefixes}) > 1  # the batch was ragged


def test_a_batched_join_whose_request_fails_leaves_the_others_alone(model, prefixes, solo):
    engine = model.engine

    def broken(logits, step):
        raise RuntimeError("this processor fails")

    with engine.idle():
        good = model.submit(prefixes[0], **_kwargs(0))
        bad = model.submit(prefixes[1], **_kwargs(1, logits_processor=broken))
        other = model.submit(prefixes[2], **_kwargs(2, stream=True, chunk_frames=4))
    with pytest.raises(RuntimeError, match="this processor fails"):
        bad.result()
    _check_solo(_result(good), solo[0])
    _check_solo(_result(other), solo[2])
    assert not engine.busy


def test_chunked_prefill_interleaves_with_running_streams_and_changes_nothing(model, prefixes, solo):
    """With prefill_chunk=8 (a multiple of the tiny model's SSD chunk), a join's prefill runs one piece per decode
    step of the running stream: the joiner starts several steps after it was submitted, and both requests give
    exactly their solo codes and audio (the solo runs prefill whole)."""
    engine = Engine(model, slots=4, prefill_chunk=8)
    seen = {}

    def submitter(frame, step, max_steps):
        if step == 3 and "joiner" not in seen:
            seen["submitted"] = engine.steps
            seen["joiner"] = engine.submit(_request(model, prefixes, 1, stream=True, chunk_frames=4, callback=joined))
        return True

    def joined(frame, step, max_steps):
        seen.setdefault("first_step", engine.steps)
        return True

    try:
        first = engine.submit(_request(model, prefixes, 0, stream=True, chunk_frames=4, callback=submitter))
        _check_solo(_result(first), solo[0])
        _check_solo(_result(seen["joiner"]), solo[1])
        pieces = -(-(prefixes[1].shape[1] + 1) // 8)  # the prefix and the first (masked) code frame
        assert pieces >= 3 and engine.join_pieces == -(-(prefixes[0].shape[1] + 1) // 8) + pieces
        assert seen["first_step"] - seen["submitted"] >= pieces  # one piece per step of the running stream
    finally:
        engine.shutdown()


def test_codes_need_no_codec(tmp_path, monkeypatch):
    """A model without a codec generates codes with the vocoder slab on (the default): the slab asks for the codec
    only at its first stream, so nothing tries to download one."""
    from zonos.codec.autoencoder import DACAutoencoder

    m = tiny_model(tmp_path, max_seqlen=96)
    m.autoencoder = None

    def refuse(*args, **kwargs):
        raise AssertionError("the codec was loaded for codes only")

    monkeypatch.setattr(DACAutoencoder, "from_pretrained", refuse)
    engine = m.start_engine(slots=2)
    assert engine.vocoding is not None
    codes = m.generate(_prefix(m, "Hello there."), max_new_tokens=12, progress_bar=False)
    assert codes.shape[:2] == (1, 9) and codes.shape[2] > 0


def test_a_handle_tells_when_its_request_joined_the_steps(model, prefixes):
    """``started`` is set once the request is queued and prefilled, between its submit and its first audio."""
    handle = model.submit(prefixes[0], max_new_tokens=12, stream=True, generator=torch.Generator().manual_seed(3))
    first = next(iter(handle))
    assert first.audio.shape[-1] > 0 and handle.started is not None
    assert handle.submitted <= handle.started <= handle.submitted + handle.ttfa
    for _ in handle:
        pass
