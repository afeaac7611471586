"""Streaming equals one-shot: codes exactly, audio to ≥ 90 dB SNR (fp32, CPU); frames leave exactly when
their 9th codebook is written; EOS flushes; cancelling leaves the model ready; bad schedules fail clearly."""

import math

import pytest
import torch

from tests.test_model import _prefix
from tests.tiny import tiny_model
from zonos.codec.streaming import receptive_field
from zonos.streaming import ChunkAssembler


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("hybrid"))


@pytest.fixture(scope="module")
def prefix(model):
    return _prefix(model)


def _snr_db(ref, x):
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum().clamp_min(1e-30)))


def _run(model, prefix, seed, **kw):
    kw.setdefault("max_new_tokens", 30)
    return model.generate(prefix, progress_bar=False, generator=torch.Generator().manual_seed(seed), **kw)


@pytest.mark.parametrize("first,steady", [(1, 1), (1, 3), (2, 8), (7, 5), (3, 64)])
def test_stream_equals_one_shot(model, prefix, first, steady):
    codes = _run(model, prefix, seed=3)
    chunks = list(_run(model, prefix, seed=3, stream=True, first_chunk_frames=first, chunk_frames=steady))
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])
    assert torch.equal(torch.cat([c.codes for c in chunks], -1), codes)
    audio = torch.cat([c.audio for c in chunks], -1)
    ref = model.autoencoder.decode(codes)
    assert audio.shape == ref.shape
    assert _snr_db(ref, audio) >= 90
    # Ranges tile the utterance without gaps.
    assert [c.frames[0] for c in chunks[1:]] == [c.frames[1] for c in chunks[:-1]]
    assert [c.samples[0] for c in chunks[1:]] == [c.samples[1] for c in chunks[:-1]]
    assert chunks[-1].samples[1] == ref.shape[-1]


def test_batch_of_two_streams(model, prefix):
    codes = _run(model, prefix, seed=4, batch_size=2, max_new_tokens=20)
    chunks = list(_run(model, prefix, seed=4, batch_size=2, max_new_tokens=20, stream=True, chunk_frames=3))
    assert torch.equal(torch.cat([c.codes for c in chunks], -1), codes)
    assert _snr_db(model.autoencoder.decode(codes), torch.cat([c.audio for c in chunks], -1)) >= 90


@pytest.fixture
def own_decoders(model):
    """Streams on decoders of their own (the engine's vocoder_batching off), for the ChunkAssembler's schedule."""
    model.start_engine(vocoder_batching=False)
    yield
    model.start_engine()


def test_slab_chunks_leave_at_its_pushes(model, prefix, monkeypatch):
    """On the vocoder slab (the default) a stream alone gets its first audio at the first push that can hold it
    (the push that ends at its 10th complete frame; no wait for more audio, which pushes at the CPU's pace would
    ask for), then every push's frames and audio as a chunk of their own with 1-frame chunks, or gathered into
    chunks doubling up to ``chunk_frames``."""
    monkeypatch.setattr("zonos.engine.vocoding.FIRST_AUDIO_TICKS", 0.0)
    lookahead = receptive_field(model.autoencoder.dac.config).lookahead_frames
    push = model.engine.vocoder_frames
    chunks = list(_run(model, prefix, seed=5, max_new_tokens=60, stream=True, first_chunk_frames=1, chunk_frames=1))
    assert chunks[0].frames == (0, lookahead) and chunks[0].audio.shape[-1] == 512 * lookahead - 4757
    assert all(c.frames[1] - c.frames[0] == push for c in chunks[1:-2])  # (the stream's end falls in the next)
    assert all(c.audio.shape[-1] == 512 * push for c in chunks[1:-1])
    assert chunks[-2].frames[1] == chunks[-1].frames[1] == 60 and chunks[-1].samples[1] == 512 * 60
    chunks = list(_run(model, prefix, seed=5, max_new_tokens=60, stream=True, first_chunk_frames=2, chunk_frames=16))
    assert [c.frames[1] - c.frames[0] for c in chunks[1:4]] == [push, 2 * push, 16]


def test_a_lone_slab_stream_has_its_ticks_placed_for_the_first_audio_it_waits_for(model, prefix, monkeypatch):
    """When its first chunk must hold more than the earliest push's audio (ticks far apart), a stream alone on the
    slab has the ticks placed so that the push that holds it comes at the first decode step that completes enough
    frames, not a whole tick after the earliest audio."""
    from zonos.engine.vocoding import SlabVocoding

    field = receptive_field(model.autoencoder.dac.config)
    wanted = 900  # samples: more than the 363 of the earliest push (10 frames)
    monkeypatch.setattr(SlabVocoding, "first_samples", lambda self: wanted)
    frames = math.ceil((wanted + field.lookahead_samples) / field.hop_length)  # 12, two steps past the earliest
    assert (frames - field.lookahead_frames) % model.engine.vocoder_frames  # off the earliest push's phase
    chunks = list(_run(model, prefix, seed=5, max_new_tokens=60, stream=True, first_chunk_frames=1, chunk_frames=1))
    assert chunks[0].frames == (0, frames) and chunks[0].audio.shape[-1] == 512 * frames - field.lookahead_samples
    assert torch.equal(torch.cat([c.codes for c in chunks], -1), _run(model, prefix, seed=5, max_new_tokens=60))


def test_frames_leave_exactly_when_their_last_codebook_is_written(model, prefix, monkeypatch, own_decoders):
    """With 1-frame chunks, every push after the first carries exactly the newest final frame: frame t
    leaves at the step that writes column t + 9 — not one step earlier, not one later."""
    takes = []
    real_take = ChunkAssembler.take

    def take(self, delayed, offset, *args):
        takes.append(offset)
        return real_take(self, delayed, offset, *args)

    monkeypatch.setattr(ChunkAssembler, "take", take)
    chunks = [c for c in _run(model, prefix, seed=5, stream=True, first_chunk_frames=1, chunk_frames=1) if not c.final]
    lookahead = receptive_field(model.autoencoder.dac.config).lookahead_frames
    assert chunks[0].frames == (0, lookahead + 1) and takes[0] == lookahead + 1 + 8
    for chunk, offset in zip(chunks[1:], takes[1:]):
        start, end = chunk.frames
        assert end - start == 1
        assert end - 1 + 9 == offset  # frame end-1's codebook 8 sits in column end-1+9, written just now


def test_chunks_double_up_to_the_steady_size(model, prefix, own_decoders):
    """After the first chunk (the lookahead's frames and ``first_chunk_frames``), chunks double until they reach
    ``chunk_frames``; a first chunk larger than that is followed by steady chunks at once."""
    lookahead = receptive_field(model.autoencoder.dac.config).lookahead_frames
    for first, steady, sizes in ((1, 6, [2, 4, 6, 6]), (2, 16, [4, 8, 16]), (5, 3, [3, 3, 3])):
        chunks = list(_run(model, prefix, seed=7, max_new_tokens=60, stream=True, first_chunk_frames=first,
                           chunk_frames=steady))  # fmt: skip
        frames = [c.frames[1] - c.frames[0] for c in chunks]
        assert frames[0] == lookahead + first
        assert frames[1 : 1 + len(sizes)] == sizes, frames


def test_eos_flushes_the_tail(model, prefix):
    def eos_at_step_20(logits, step):
        # Decode step 20 writes column 21: EOS in codebook 0 for frame 20; no EOS before or after.
        at = (step == 20)[:, None]
        first = logits[:, 0].clone()
        first[:, model.eos_token_id] = float("-inf")
        forced = torch.full_like(first, float("-inf"))
        forced[:, model.eos_token_id] = 0.0
        return torch.cat([torch.where(at, forced, first)[:, None], logits[:, 1:]], dim=1)

    codes = _run(model, prefix, seed=6, max_new_tokens=60, logits_processor=eos_at_step_20)
    chunks = list(_run(model, prefix, seed=6, max_new_tokens=60, stream=True, chunk_frames=4,
                       logits_processor=eos_at_step_20))  # fmt: skip
    assert codes.shape[-1] == 20  # frames 0..19, before the EOS frame
    assert torch.equal(torch.cat([c.codes for c in chunks], -1), codes)
    assert chunks[-1].final and chunks[-1].samples[1] == 512 * 20
    assert _snr_db(model.autoencoder.decode(codes), torch.cat([c.audio for c in chunks], -1)) >= 90


def test_cancel_then_generate_again(model, prefix):
    expected = _run(model, prefix, seed=9, max_new_tokens=25)
    stream = _run(model, prefix, seed=1, max_new_tokens=60, stream=True, first_chunk_frames=1, chunk_frames=1)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    assert torch.equal(_run(model, prefix, seed=9, max_new_tokens=25), expected)
    chunks = list(_run(model, prefix, seed=9, max_new_tokens=25, stream=True))
    assert torch.equal(torch.cat([c.codes for c in chunks], -1), expected)


def test_callback_can_stop_a_stream(model, prefix):
    chunks = list(
        _run(model, prefix, seed=2, max_new_tokens=60, stream=True, chunk_frames=2, callback=lambda f, s, m: s < 15)
    )
    frames = sum(c.codes.shape[-1] for c in chunks)
    assert chunks[-1].final and frames == 15 + 1 - 8  # steps 1..15 wrote columns 2..16: frames 0..7 final


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_bad_chunk_sizes(model, prefix, bad):
    with pytest.raises(ValueError, match="chunk_frames must be a positive int"):
        _run(model, prefix, seed=0, stream=True, chunk_frames=bad)
    with pytest.raises(ValueError, match="first_chunk_frames must be a positive int"):
        _run(model, prefix, seed=0, stream=True, first_chunk_frames=bad)


def test_warmup_leaves_no_trace(model, prefix, capsys):
    """``warmup`` runs two streamed requests behind a progress bar; afterwards a request gives what it gives on
    a model that never warmed up, and the caller's random streams are untouched."""
    before = _run(model, prefix, seed=5)
    cpu_rng = torch.get_rng_state()
    seconds = model.warmup(prefix_length=7, frames=12, first_chunk_frames=1, chunk_frames=3)
    assert seconds > 0
    assert "Warming up" in capsys.readouterr().err
    assert torch.equal(torch.get_rng_state(), cpu_rng)
    assert torch.equal(_run(model, prefix, seed=5), before)


def test_warmup_can_capture_every_prefill_piece(model, prefix):
    """With ``all_prefill_lengths`` the warm-up asks the engine's graph cache (set up on CUDA) to capture every
    prefill piece size on each bucket of the engine's staging rows."""
    prepared = []
    engine = model.engine

    class Graphs:  # stands in for zonos_accel.graphs.GraphCache
        def step(self, slots, n, use, processors, backend):
            slots.step(n, use, processors)

        def prefill_piece(self, backbone, hidden, state, valid):
            return backbone(hidden, state, valid)

        def prepare_prefill(self, backbone, state):
            prepared.append(state)

    engine.use_graphs(Graphs())
    try:
        model.warmup(prefix_length=5, frames=11, all_prefill_lengths=True, progress_bar=False)
    finally:
        engine.use_graphs(None)
    assert [state.batch_size for state in prepared] == [2 * u for u in (1, 2, 4)]
    assert all(state.position.data_ptr() == engine.staging.position.data_ptr() for state in prepared)  # views


@pytest.mark.parametrize("kwargs", [{"prefix_length": 0}, {"frames": 0}, {"frames": 2.5}, {"batch_size": 0}])
def test_warmup_rejects_bad_sizes(model, kwargs):
    with pytest.raises(ValueError, match="must be a positive int|must be an integer in"):
        model.warmup(progress_bar=False, **kwargs)


def test_warmup_bar_names_the_kernels_it_compiles():
    """``naming_compiles`` shows each Triton kernel's name on the bar as Triton is about to compile it (its
    ``jit_cache_hook``), still calls a hook set before, never skips the compile, and restores the hook after."""
    knobs = pytest.importorskip("triton").knobs
    from triton.runtime.jit import JitFunctionInfo

    from zonos.utils import naming_compiles

    class Bar:
        postfix = ""

        def set_postfix_str(self, text, refresh=True):
            self.postfix = text

    seen = []

    def earlier(**kwargs):
        seen.append(kwargs["fn"].name)

    knobs.runtime.jit_cache_hook = earlier
    bar = Bar()
    try:
        with naming_compiles(bar):
            hook = knobs.runtime.jit_cache_hook
            skip = hook(key="k", repr="r", fn=JitFunctionInfo(None, "_sample_kernel", None), compile={},
                        is_manual_warmup=False, already_compiled=False)  # fmt: skip
            assert not skip and bar.postfix == "compiling _sample_kernel" and seen == ["_sample_kernel"]
        assert knobs.runtime.jit_cache_hook is earlier
    finally:
        knobs.runtime.jit_cache_hook = None


def test_a_slab_streams_first_chunk_holds_what_plays_until_the_next_push():
    """The first chunk with audio waits until it holds ``first_samples`` (pushes before it are gathered into it);
    later chunks follow the frame schedule, and a stream's end hands out what it holds."""
    from zonos.engine.vocoding import SlabStream

    def push(stream, samples, frames=4, final=False, first=1000):
        return stream.add(torch.randn(samples), torch.zeros(9, frames, dtype=torch.long), final, first)

    stream = SlabStream(first_chunk_frames=1, chunk_frames=16)
    assert push(stream, 0) is None and push(stream, 363) is None and push(stream, 600) is None
    chunk = push(stream, 2048)
    assert chunk.samples == (0, 363 + 600 + 2048) and chunk.frames == (0, 16)
    assert push(stream, 2048).samples == (3011, 3011 + 2048)  # then every push's frames (2 >= the doubled size)
    short = SlabStream(first_chunk_frames=1, chunk_frames=16)
    assert push(short, 363) is None and push(short, 100, final=True).samples == (0, 463)


def test_a_slab_stream_hands_out_early_what_a_player_would_run_out_of():
    """With a clock, a chunk still short of its frames goes out once the audio handed out before it, played from
    the first audible chunk on, lasts less than the reserve; far ahead of playback it waits for its size."""
    from zonos.engine.vocoding import SlabStream

    def push(stream, now):
        return stream.add(torch.randn(2048), torch.zeros(9, 4, dtype=torch.long), False, 1, now, 0.03)

    stream = SlabStream(first_chunk_frames=4, chunk_frames=16, sample_rate=44_100)
    assert push(stream, 10.0).samples == (0, 2048)  # first audio at t = 10 s, playing until 10.046 s; then 8 frames
    assert push(stream, 10.001) is None  # 45 ms left to play: gather
    assert push(stream, 10.020).frames == (4, 12)  # its 8 frames; out until 10.139 s, then 16 frames
    assert push(stream, 10.030) is None  # 109 ms left
    chunk = push(stream, 10.115)  # 24 ms left, within the 30 ms reserve: out with 8 of its 16 frames
    assert chunk.frames == (12, 20) and chunk.samples == (6144, 10240)
    clockless = SlabStream(first_chunk_frames=4, chunk_frames=16, sample_rate=44_100)
    assert [push(clockless, None) is None for _ in range(5)] == [False, True, False, True, True]  # the schedule
