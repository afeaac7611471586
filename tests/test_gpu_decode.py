"""Decode with CUDA graphs on equals decode with them off (tiny hybrid model, fp32, fresh random weights, on a
GPU), across requests, sampling settings, guidance, EOS and backends; switching accelerators on a live model
makes the next request capture and replay the new backend's step; and (Zonos-v0.1-hybrid size, bf16) a request
batched beside others picks what it picks alone, up to bf16 rounding.

Every run goes through the public seam ``generate(logits_processor=...)``: the processors here are tensor work
only, so they are captured in the step graph, and they write what they see into buffers of their own (poisoned
with NaN or -1 before each run), which the graph's replays rewrite. The engine calls a processor for the
prefill's first token (step 0) and for every decode step (step s writes delayed column s + 1).
"""

import importlib.util

import pytest
import torch

from tests.test_gpu_prefill import real_size_bf16
from tests.tiny import random_state_dict, tiny_codec, tiny_config
from zonos.codebook_pattern import CODEBOOK_SIZE, N_CODEBOOKS, UNKNOWN, apply_delay_pattern
from zonos.config import ZonosConfig
from zonos.engine import Request
from zonos.engine.engine import SYNC_EVERY
from zonos.model import Zonos
from zonos.ops.backend import REFERENCE
from zonos.sampling import SamplingParams

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
STEPS = 60
HAVE_CUTLASS = importlib.util.find_spec("cutlass") is not None


def test_cuda_graphs_need_a_cuda_model():
    from zonos_accel.graphs import GraphCache

    model = Zonos(ZonosConfig.from_dict(tiny_config("hybrid")))
    with pytest.raises(ValueError, match="CUDA device"):
        model.use_accelerators(fast_ops=False, cuda_graphs=True)
    with pytest.raises(ValueError, match="CUDA device"):
        GraphCache("cpu")


class Recorder:
    """A logits processor that keeps the logits of slot 0 (where a request running alone sits) at index ``step``
    of a buffer, and bars EOS from codebook 0, or (``eos_at``) makes EOS win it from that step on."""

    def __init__(self, eos_token_id: int, eos_at: int | None = None, steps: int = STEPS + N_CODEBOOKS):
        self.eos_token_id = eos_token_id
        self.eos_at = eos_at
        self.steps = steps
        self.logits: torch.Tensor | None = None

    @torch.inference_mode()
    def poison(self) -> None:
        if self.logits is not None:  # made on the engine's thread, in inference mode
            self.logits.fill_(float("nan"))

    def __call__(self, logits: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        if self.logits is None:  # first (eager) call; the capture then writes into the same buffer
            self.logits = torch.full((self.steps, *logits.shape[1:]), float("nan"), device=logits.device)
        self.logits.index_copy_(0, step[:1].clamp(max=self.steps - 1), logits[:1])
        out = logits.clone()
        if self.eos_at is None:
            out[:, 0, self.eos_token_id] = float("-inf")
        else:
            out[:, 0, self.eos_token_id] = torch.where(step >= self.eos_at, 1e4, float("-inf"))
        return out


def _model() -> Zonos:
    torch.manual_seed(0)
    model = Zonos(ZonosConfig.from_dict(tiny_config("hybrid")), max_seqlen=256)
    model.load_checkpoint(random_state_dict(model, 0), device="cuda", dtype=torch.float32)
    return model.eval()


def _prefix(length: int, seed: int, d: int = 64, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(2, length, d, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).to(dtype)


def _graphs_on(model: Zonos, on: bool = True) -> None:
    model.use_accelerators(fast_ops=False, cuda_graphs=on)


def _generate(model, recorder, prefix, params=None, seed=0, cfg_scale=2.0, stop_after=None, generator=True):
    """Codes, per-step logits and the caller's generator state after one request; ``stop_after`` stops it after
    that many steps."""
    steps = []

    def callback(frame, step, max_steps):
        steps.append(step)
        return stop_after is None or step < stop_after

    if generator:
        gen = torch.Generator("cuda").manual_seed(seed)
    else:
        gen = None
        torch.manual_seed(seed)
    recorder.poison()
    codes = model.generate(
        prefix,
        max_new_tokens=STEPS,
        cfg_scale=cfg_scale,
        sampling_params=params,
        progress_bar=False,
        callback=callback,
        generator=gen,
        logits_processor=recorder,
    )
    after = gen.get_offset() if gen is not None else torch.get_rng_state()
    assert steps == list(range(1, len(steps) + 1))
    logits = recorder.logits[: len(steps) + 1].clone()  # the prefill's first token, then every step
    assert not logits.isnan().any()  # every step's logits were recorded
    return codes, logits, after


def _assert_same(eager, graph):
    codes_e, logits_e, after_e = eager
    codes_g, logits_g, after_g = graph
    assert logits_g.shape == logits_e.shape and logits_e.shape[0] >= 50
    finite = torch.isfinite(logits_e)
    assert torch.equal(finite, torch.isfinite(logits_g))
    torch.testing.assert_close(logits_g[finite], logits_e[finite], rtol=1e-5, atol=1e-5)
    assert torch.equal(codes_g, codes_e)
    if isinstance(after_e, torch.Tensor):
        assert torch.equal(after_g, after_e)
    else:
        assert after_g == after_e  # the caller's generator advanced exactly as with graphs off


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    "params", [{"min_p": 0.1}, {"temperature": 0.0}, {"top_k": 20, "top_p": 0.9, "temperature": 0.8}]
)
def test_graph_replay_equals_eager_across_requests(params):
    """Graph on and graph off give the same codes and logits: the noise is a function of each request's seed
    and step, so a replay draws what the eager step draws."""
    model = _model()
    recorder = Recorder(model.eos_token_id)
    a, b = _prefix(11, 1), _prefix(17, 2)
    eager = [_generate(model, recorder, a, params, seed=5), _generate(model, recorder, b, params, seed=6)]

    _graphs_on(model)
    graphs = model.engine.graphs
    with torch.inference_mode():
        model.engine.prepare_prefill()  # every prefill piece, so what follows counts step graphs only
    pieces = graphs.captures
    graph_a = _generate(model, recorder, a, params, seed=5)
    assert graphs.captures == pieces + 1  # the step of a one-slot bucket
    _generate(model, recorder, _prefix(5, 3), params, seed=7, stop_after=7)  # a request stopped in between
    replays = graphs.replays
    graph_b = _generate(model, recorder, b, params, seed=6)
    assert graphs.captures == pieces + 1  # later requests replay the same graph
    assert graphs.replays - replays >= STEPS

    _assert_same(eager[0], graph_a)
    _assert_same(eager[1], graph_b)
    if params.get("temperature") == 0.0:
        assert not torch.equal(graph_a[0], graph_b[0])  # different prefixes, different greedy codes


@cuda
@pytest.mark.gpu
def test_default_generator_and_guidance_off():
    model = _model()
    recorder = Recorder(model.eos_token_id)
    prefix = _prefix(13, 4)
    eager = [
        _generate(model, recorder, prefix, seed=8, generator=False),
        _generate(model, recorder, prefix, seed=9, cfg_scale=1.0),
    ]
    _graphs_on(model)
    with torch.inference_mode():
        model.engine.prepare_prefill()
    pieces = model.engine.graphs.captures
    graph = [
        _generate(model, recorder, prefix, seed=8, generator=False),
        _generate(model, recorder, prefix, seed=9, cfg_scale=1.0),
    ]
    assert model.engine.graphs.captures == pieces + 1  # the guidance scale is a slot tensor: one graph serves both
    for e, g in zip(eager, graph):
        _assert_same(e, g)


@cuda
@pytest.mark.gpu
def test_eos_bookkeeping_in_the_graph():
    model = _model()
    recorder = Recorder(model.eos_token_id, eos_at=40)
    prefix = _prefix(9, 5)

    def run():
        return model.generate(
            prefix, max_new_tokens=STEPS, progress_bar=False, generator=torch.Generator("cuda"),
            logits_processor=recorder,
        )  # fmt: skip

    eager = run()
    _graphs_on(model)
    graph = run()
    assert model.engine.graphs.replays > 0
    assert eager.shape[2] < STEPS - 9  # stopped early, after EOS ran down the codebooks
    assert torch.equal(graph, eager)
    _graphs_on(model, False)
    assert model.engine.graphs is None
    assert torch.equal(run(), eager)


@cuda
@pytest.mark.gpu
def test_end_is_seen_within_two_check_intervals():
    """On CUDA the slot stops itself on the device once codebook 8's EOS is written (no column after it is
    written), and the host reads the slots' flags a check interval late (no queue drain), so it stops calling
    back fewer than 2 * SYNC_EVERY steps after that, and never before it."""
    model = _model()
    recorder = Recorder(model.eos_token_id, eos_at=40)
    _graphs_on(model)
    columns = {}

    def record(frame, step, max_steps):
        columns[step + 1] = frame[0, :, 0].cpu()
        return True

    model.generate(_prefix(9, 5), max_new_tokens=STEPS, progress_bar=False, callback=record, logits_processor=recorder)
    eos_column = min(c for c, col in columns.items() if col[0] == model.eos_token_id)
    last = eos_column + N_CODEBOOKS - 1
    assert columns[last][-1] == model.eos_token_id
    assert last <= max(columns) < last + 2 * SYNC_EVERY
    assert all((columns[c] == UNKNOWN).all() for c in columns if c > last)


@cuda
@pytest.mark.gpu
def test_warmup_captures_before_the_first_request():
    """After ``warmup`` with a request's settings, the request captures nothing, and its codes are the eager
    run's."""
    model = _model()
    model.autoencoder = tiny_codec("cuda")
    prefix = _prefix(8, 6)

    def run():
        return model.generate(
            prefix, max_new_tokens=STEPS, sampling_params={"min_p": 0.1}, progress_bar=False,
            generator=torch.Generator("cuda").manual_seed(3),
        )  # fmt: skip

    eager = run()
    _graphs_on(model)
    model.warmup(prefix_length=8, frames=16, progress_bar=False)
    graphs = model.engine.graphs
    captures, replays = graphs.captures, graphs.replays
    assert captures > 0
    graph = run()
    assert graphs.captures == captures and graphs.replays > replays
    assert torch.equal(graph, eager)


@cuda
@pytest.mark.gpu
def test_a_shut_down_engine_releases_its_graphs():
    """The model's graph cache outlives its engines: restarting the engine drops the graphs captured on the old
    engine's state (keyed by its serial), and the new engine captures its own and decodes the same codes."""
    model = _model()
    _graphs_on(model)
    prefix = _prefix(8, 6)

    def run():
        return model.generate(prefix, max_new_tokens=STEPS, progress_bar=False,
                              generator=torch.Generator("cuda").manual_seed(5))  # fmt: skip

    first = run()
    graphs = model.engine.graphs
    engine = model.engine
    old = {engine.slots.state.serial, engine.staging.serial, *(v.serial for v in engine.staging_rows.values())}
    assert any(key[1] in old for key in graphs._graphs)
    model.start_engine(slots=model.engine.slots.count)
    assert not any(key[1] in old for key in graphs._graphs)
    assert torch.equal(run(), first)
    assert any(key[1] == model.engine.slots.state.serial for key in graphs._graphs)


@cuda
@pytest.mark.gpu
def test_vocoder_batching_streams_match_their_solo_streams():
    """With CUDA graphs and ``vocoder_batching``, four staggered streams (EOS suppressed) are decoded together as
    rows of the vocoder slab (graphs per bucket of rows, on the slab's stream): each stream's codes equal its solo
    run's, and its audio matches it (cuDNN may sum a batch of rows in another order: ≥ 60 dB)."""
    from tests.test_codec_streaming import snr_db

    model = _model()
    model.autoencoder = tiny_codec("cuda")
    _graphs_on(model)
    prefixes = [_prefix(8 + i, 20 + i) for i in range(4)]
    no_eos = Recorder(model.eos_token_id, steps=STEPS + 40 + N_CODEBOOKS)
    kwargs = dict(max_new_tokens=STEPS + 40, stream=True, chunk_frames=4, progress_bar=False, logits_processor=no_eos)

    def chunks(handle):
        got = list(handle)
        return torch.cat([c.codes for c in got], -1), torch.cat([c.audio for c in got], -1)

    solo = [chunks(model.submit(p, generator=torch.Generator("cuda").manual_seed(i), **kwargs)) for i, p in
            enumerate(prefixes)]  # fmt: skip
    engine = model.start_engine(slots=4, vocoder_batching=True)
    handles = []
    for i, p in enumerate(prefixes):  # a few steps apart
        handles.append(model.submit(p, generator=torch.Generator("cuda").manual_seed(i), **kwargs))
        it = iter(handles[-1])
        handles[-1] = (it, [next(it)])
    for i, (it, first) in enumerate(handles):
        rest = list(it)
        codes = torch.cat([c.codes for c in first + rest], -1)
        audio = torch.cat([c.audio for c in first + rest], -1)
        assert torch.equal(codes, solo[i][0]), i
        assert audio.shape == solo[i][1].shape and snr_db(audio, solo[i][1]) >= 60, i
    assert engine.vocoding.most_rows >= 2 and engine.vocoding.pushes > 0


@pytest.mark.gpu
def test_graph_with_triton_ops_equals_eager_reference():
    from zonos_accel.graphs import GraphCache
    from zonos_accel.triton import DEFAULT_OPS, triton_backend

    model = _model()
    recorder = Recorder(model.eos_token_id)
    prefix = _prefix(12, 7)
    eager = _generate(model, recorder, prefix, {"temperature": 0.0})
    # ssd_scan (prefill) is left out: mamba_ssm's chunked kernels need larger chunks than the tiny model's 8.
    ops = tuple(op for op in DEFAULT_OPS if op != "ssd_scan")
    model.set_backend(triton_backend(REFERENCE, ops), GraphCache("cuda"))
    fast = _generate(model, recorder, prefix, {"temperature": 0.0})
    assert model.engine.graphs.captures > 0 and model.engine.graphs.replays > 0
    codes_e, logits_e, _ = eager
    codes_f, logits_f, _ = fast
    finite = torch.isfinite(logits_e)
    torch.testing.assert_close(logits_f[finite], logits_e[finite], rtol=1e-4, atol=1e-4)
    assert torch.equal(codes_f, codes_e)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("params", [{"min_p": 0.1}, {"temperature": 0.0}, {"linear": 0.5, "conf": 0.4, "quad": 0.2}])
def test_fused_sampling_in_the_graph_gives_the_reference_codes(params):
    """The fused sampler and step bookkeeping, replayed in the step graph with the other Triton ops, give the codes of
    the eager reference run (EOS from step 30 on, so the bookkeeping's end runs too)."""
    from zonos_accel.graphs import GraphCache
    from zonos_accel.triton import DEFAULT_OPS, FUSED_SAMPLING_OPS, triton_backend

    model = _model()
    recorder = Recorder(model.eos_token_id, eos_at=30)
    prefix = _prefix(12, 8)

    def run():  # not _generate: past the end the host calls back for steps whose logits the device never made
        return model.generate(
            prefix, max_new_tokens=STEPS, sampling_params=params, progress_bar=False,
            generator=torch.Generator("cuda").manual_seed(0), logits_processor=recorder,
        )  # fmt: skip

    eager = run()
    assert eager.shape[2] < STEPS - 9  # stopped early, after EOS ran down the codebooks
    ops = tuple(op for op in DEFAULT_OPS if op != "ssd_scan") + FUSED_SAMPLING_OPS
    model.set_backend(triton_backend(REFERENCE, ops), GraphCache("cuda"))
    fast = run()
    assert model.engine.graphs.replays > 0
    assert torch.equal(fast, eager)


@cuda
@pytest.mark.gpu
def test_the_fast_ops_bring_the_fused_sampler_by_default():
    from zonos.ops import sample_rows as reference_sample_rows

    model = _model()
    model.use_accelerators()
    assert model.backend.sample_rows is not reference_sample_rows  # the fused kernel, with the other fast ops
    model.use_accelerators(fused_sampling=False)
    assert model.backend.sample_rows is reference_sample_rows and model.backend.name != "torch"
    model.use_accelerators(fast_ops=False)
    assert model.backend.sample_rows is reference_sample_rows


@cuda
@pytest.mark.gpu
def test_programmatic_dependent_launch_changes_no_result():
    """Our Triton kernels launched with PDL (the default) inside the graph give bit for bit the results of
    the same kernels launched in stream order: PDL only moves launches, never a read before a write."""
    from zonos_accel.graphs import GraphCache
    from zonos_accel.triton import DEFAULT_OPS, pdl, triton_backend

    results = []
    for enabled in (False, True):
        pdl.ENABLED = enabled
        try:
            model = _model()
            model.set_backend(
                triton_backend(REFERENCE, tuple(op for op in DEFAULT_OPS if op != "ssd_scan")), GraphCache("cuda")
            )
            results.append(_generate(model, Recorder(model.eos_token_id), _prefix(12, 7), {"min_p": 0.1}))
            model.engine.shutdown()
        finally:
            pdl.ENABLED = True
    (codes_a, logits_a, _), (codes_b, logits_b, _) = results
    assert torch.equal(codes_a, codes_b)
    assert torch.equal(logits_a, logits_b)


# -- Zonos-v0.1-hybrid size, bf16: live switching and batching ------------------------------------------------


class TeacherForced:
    """A logits processor that makes the request with noise seed ``seed`` follow ``codes`` (1, 9, T) and records,
    for each decode step and codebook, the code the model ranked first (in ``top``, -1 where not recorded).

    Every step then feeds the model the same tokens whatever it ranks first, so two runs (two backends, or solo
    against batched) can be compared step by step without one early difference changing everything after it.
    The engine runs every processor on the whole bucket (keeping its result only for the request's own rows), so
    the request's row is found by its seed in the engine's slots."""

    def __init__(self, model: Zonos, codes: torch.Tensor, seed: int):
        self.delayed = apply_delay_pattern(codes.to(model.device), model.masked_token_id)[0]  # (9, T + 9)
        self.seed = seed
        self.slot_seeds = model.engine.slots.seeds
        self.top = torch.full((self.delayed.shape[1], N_CODEBOOKS), -1, device=model.device, dtype=torch.long)
        frames = codes.shape[-1]
        step = torch.arange(self.delayed.shape[1])[:, None]
        offset = step - torch.arange(N_CODEBOOKS)  # step s writes codebook k of frame s - k
        self.recorded = ((offset >= 0) & (offset < frames) & (step >= 1)).to(model.device)  # the decode steps' codes

    def __call__(self, logits: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        n, _, width = logits.shape
        column = (step + 1).clamp(max=self.delayed.shape[1] - 1)
        target = self.delayed[:, column].T  # (n, 9)
        forced = torch.where(torch.arange(width, device=logits.device) == target[..., None], 0.0, float("-inf"))
        is_code = (target >= 0) & (target < CODEBOOK_SIZE)
        mine = (self.slot_seeds[:n] == self.seed) & (step >= 1)  # the prefill (step 0) is not recorded
        row = mine.int().argmax()[None]  # 1-d indices throughout: no host read, so this is captured
        at = step.index_select(0, row).clamp(max=self.top.shape[0] - 1)
        top = logits.index_select(0, row).argmax(-1)
        self.top.index_copy_(0, at, torch.where(mine.any(), top, self.top.index_select(0, at)))
        return torch.where(is_code[..., None], forced, logits)

    def take(self) -> torch.Tensor:
        """The recorded codes (decode steps, 9), checked complete, and the buffer poisoned for the next run."""
        top = self.top.clone()
        assert (top[self.recorded] >= 0).all(), "a step was not recorded"
        self.top.fill_(-1)
        return top


def _agreement(a: torch.Tensor, b: torch.Tensor, recorded: torch.Tensor) -> float:
    return (a[recorded] == b[recorded]).double().mean().item()


@pytest.fixture(scope="module")
def real_size():
    """Zonos-v0.1-hybrid with random bf16 weights on the default accelerators (Triton ops where installed, CUDA
    graphs), and a function that runs one request through the engine with a given seed."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = real_size_bf16(max_seqlen=512)
    model.use_accelerators()

    def no_eos(logits, step):
        out = logits.clone()
        out[:, 0, model.eos_token_id] = float("-inf")
        return out

    def request(prefix, seed, processor=None):
        """A request of STEPS frames with noise seed ``seed``; EOS barred unless ``processor`` forces the codes."""
        return Request(
            prefix=prefix, max_new_tokens=STEPS, cfg_scale=2.0, sampling=SamplingParams(min_p=0.1), seeds=[seed],
            logits_processor=processor or no_eos,
        )  # fmt: skip

    yield model, request
    model.engine.shutdown()


@cuda
@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_CUTLASS, reason="needs nvidia-cutlass-dsl")
def test_switching_to_the_cute_gemv_on_a_live_model_captures_and_replays_it(real_size):
    """A model that has generated on the default backend is switched with ``use_accelerators(use_cute_gemv=True)``:
    the next request captures a step graph for the new backend and replays it, and (teacher-forced on the same
    codes) ranks first what the old backend did, up to bf16 rounding (agreement reported, loose floor). Then
    ``set_backend`` switches between the two backends on one graph cache: each captures once, and switching back
    replays the graph keyed by the backend, which gives what that backend gave before."""
    model, request = real_size
    engine = model.engine
    prefix = _prefix(40, 11, d=2048, dtype=torch.bfloat16)
    codes = engine.submit(request(prefix, seed=21)).result()
    assert codes.shape == (1, N_CODEBOOKS, STEPS)
    before = model.backend
    forced = TeacherForced(model, codes, seed=22)
    engine.submit(request(prefix, 22, forced)).result()
    top_before = forced.take()
    assert "cute_gemv" not in before.name

    model.use_accelerators(use_cute_gemv=True)
    after, graphs = model.backend, engine.graphs
    assert "cute_gemv" in after.name and model.backbone.ops is after
    captures, replays = graphs.captures, graphs.replays
    engine.submit(request(prefix, 22, forced)).result()
    top_after = forced.take()
    assert graphs.captures > captures and graphs.replays - replays >= STEPS  # captured for the new backend, replayed
    agreement = _agreement(top_before, top_after, forced.recorded)
    print(f"\n{before.name} -> {after.name}: teacher-forced top-1 agreement {agreement:.4f}")
    assert agreement > 0.5

    model.set_backend(before)  # keeps the graph cache (use_accelerators made a new one, without the old graphs)
    captures = graphs.captures
    engine.submit(request(prefix, 22, forced)).result()
    assert graphs.captures > captures  # captured for the old backend here
    assert torch.equal(forced.take(), top_before)  # and it runs the old backend's kernels
    captures = graphs.captures
    model.set_backend(after)
    engine.submit(request(prefix, 22, forced)).result()
    assert graphs.captures == captures  # the new backend's graph is still in the cache, keyed by it
    assert torch.equal(forced.take(), top_after)
    model.use_accelerators()


@cuda
@pytest.mark.gpu
def test_a_request_batched_beside_three_others_agrees_with_its_solo_run(real_size):
    """Four requests run alone, then together in one bucket of four slots (8 backbone rows instead of 2, so other
    GEMM shapes and roundings in bf16). Reported: the fraction of requests whose free-running codes equal their
    solo codes, and the teacher-forced top-1 agreement (each request fed its solo codes, so an early difference
    does not change the rest). Asserted: a loose floor on the latter."""
    model, request = real_size
    engine = model.engine
    prefixes = [_prefix(30 + 7 * i, 30 + i, d=2048, dtype=torch.bfloat16) for i in range(4)]
    seeds = [40 + i for i in range(4)]
    solo = [engine.submit(request(p, s)).result() for p, s in zip(prefixes, seeds)]
    forced = [TeacherForced(model, codes, seed) for codes, seed in zip(solo, seeds)]
    solo_top = []
    for p, s, f in zip(prefixes, seeds, forced):
        engine.submit(request(p, s, f)).result()
        solo_top.append(f.take())

    def together(processors):
        with engine.idle():  # queue all four before the engine admits any: they join at the same step
            handles = [engine.submit(request(p, s, f)) for p, s, f in zip(prefixes, seeds, processors)]
        return [h.result() for h in handles]

    free = together([None] * 4)
    together(forced)
    batched_top = [f.take() for f in forced]
    exact = sum(torch.equal(a, b) for a, b in zip(free, solo)) / len(solo)
    agreements = [_agreement(a, b, f.recorded) for a, b, f in zip(solo_top, batched_top, forced)]
    print(
        f"\nbatched beside 3 others vs solo ({model.backend.name}, bf16): exact-match rate of the codes {exact:.2f}; "
        "teacher-forced top-1 agreement per request " + " ".join(f"{a:.4f}" for a in agreements)
    )
    assert min(agreements) > 0.5
