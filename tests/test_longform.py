"""Long-form speech (CPU, tiny model): segments stream as one utterance whose audio equals the one-shot decode of
all segments' codes, and each segment's codes are those of generating it with the previous codes as prefix."""

import time

import pytest
import torch

from tests.tiny import tiny_model
from zonos.conditioning import make_cond_dict
from zonos.errors import EngineFullError, ZonosInputError
from zonos.longform import longform_budget, prefix_lengths, segment_budget, speak_segments

SEGMENTS = ["The first sentence is short.", "Then comes a second one.", "And a third to end it."]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("longform"), max_seqlen=192)


def _kwargs(seed):
    return dict(max_new_tokens=24, progress_bar=False, generator=torch.Generator().manual_seed(seed))


def _snr_db(ref, x):
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum().clamp_min(1e-30)))


def test_streamed_long_form_is_one_seamless_utterance(model):
    chunks = list(
        speak_segments(model, SEGMENTS, cond={"language": "en-us"}, stream=True, chunk_frames=4, **_kwargs(3))
    )
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])
    codes = torch.cat([c.codes for c in chunks], -1)
    assert torch.equal(codes, speak_segments(model, SEGMENTS, **_kwargs(3)))  # streamed = one-shot codes
    audio = torch.cat([c.audio for c in chunks], -1)
    ref = model.autoencoder.decode(codes)
    assert audio.shape == ref.shape and _snr_db(ref, audio) >= 90
    assert [c.frames[0] for c in chunks[1:]] == [c.frames[1] for c in chunks[:-1]]
    assert [c.samples[0] for c in chunks[1:]] == [c.samples[1] for c in chunks[:-1]]


def test_a_segment_continues_the_previous_codes(model):
    long = speak_segments(model, SEGMENTS[:2], **_kwargs(5))
    g = torch.Generator().manual_seed(5)
    cond = lambda text: model.prepare_conditioning(make_cond_dict(text=text, language="en-us"))  # noqa: E731
    first = model.generate(cond(SEGMENTS[0]), max_new_tokens=24, progress_bar=False, generator=g)
    second = model.generate(
        cond(f"{SEGMENTS[0]} {SEGMENTS[1]}"),
        audio_prefix_codes=first,
        max_new_tokens=24,
        progress_bar=False,
        generator=g,
    )[..., first.shape[-1] :]
    assert torch.equal(long, torch.cat([first, second], -1))


def test_bad_segments(model):
    with pytest.raises(ZonosInputError, match="non-empty"):
        speak_segments(model, [])
    with pytest.raises(ZonosInputError, match="non-empty list"):
        speak_segments(model, "Hello there.")  # a string, not a list of them
    with pytest.raises(ZonosInputError, match="cond holds 'text'"):
        speak_segments(model, ["Hi."], cond={"text": "Hi."})
    with pytest.raises(ZonosInputError, match=r"cond holds \['mood'\]"):
        speak_segments(model, ["Hi."], cond={"mood": 1})
    for stream in (False, True):  # refused before anything runs, streaming or not
        with pytest.raises(ZonosInputError, match="nothing eSpeak can pronounce"):
            speak_segments(model, ["Hi.", "<>"], stream=stream)
        with pytest.raises(ZonosInputError, match="unsupported language"):
            speak_segments(model, ["Hi."], cond={"language": "xx"}, stream=stream)
    with pytest.raises(ZonosInputError, match="batch_size"):
        speak_segments(model, SEGMENTS, batch_size=2)
    for bad, what in [(torch.zeros(1, 8, 5, dtype=torch.long), "shape"), (torch.rand(1, 9, 5), "integer tensor"),
                      (torch.full((1, 9, 5), 1024), "codes in 0..1023"), ([[1]], "tensor")]:  # fmt: skip
        with pytest.raises(ZonosInputError, match=f"audio_prefix_codes must .*{what}"):
            speak_segments(model, SEGMENTS, audio_prefix_codes=bad)
    with pytest.raises(ZonosInputError, match="full_wait must"):
        speak_segments(model, SEGMENTS, full_wait=-1)


def test_prefix_lengths_are_those_of_the_segments_requests(model):
    texts = [SEGMENTS[0], f"{SEGMENTS[0]} {SEGMENTS[1]}", f"{SEGMENTS[1]} {SEGMENTS[2]}"]
    actual = [model.prepare_conditioning(make_cond_dict(text=t, language="en-us")).shape[1] for t in texts]
    assert prefix_lengths(model, SEGMENTS, "EN-us") == actual and actual[1] > actual[0]


@pytest.mark.parametrize("stream", [False, True])
def test_each_segment_gets_a_budget_that_fits_beside_the_previous_audio(model, stream):
    # max_new_tokens 140 fits segment 1 alone in the 192 positions, but then segment 2 (its prefix, 140 frames of
    # audio prefix and its own) would not: each segment is capped to leave the next half of what its prefix leaves.
    seen = []
    kwargs = dict(_kwargs(2), max_new_tokens=140, on_segment=lambda *a: seen.append(a))
    result = speak_segments(model, SEGMENTS, stream=stream, **kwargs)
    codes = torch.cat([c.codes for c in result], -1) if stream else result
    p = prefix_lengths(model, SEGMENTS)
    s, d = model.engine.max_seqlen, 9
    budgets = [min(140, s - d - p[0], (s - d - p[1]) // 2)]
    budgets.append(min(140, s - d - p[1] - budgets[0], (s - d - p[2]) // 2))
    budgets.append(min(140, s - d - p[2] - budgets[1]))
    # The tiny model does not end by itself: every segment takes its whole budget, and is reported as such.
    assert seen == [(k, b, b) for k, b in enumerate(budgets)] and all(0 < b < 140 for b in budgets)
    assert codes.shape == (1, 9, sum(budgets))
    assert all(p[k] + budgets[k - 1] + budgets[k] + d <= s for k in (1, 2))  # every request fit its slot
    assert budgets[0] >= longform_budget(model, SEGMENTS, max_new_tokens=140) >= 1


def test_budget_errors_count_the_previous_segments_audio(model):
    assert segment_budget(192, 60, 100) == 192 - 9 - 60 - 100
    assert segment_budget(192, 60, 0, 80, max_new_tokens=30) == 30
    with pytest.raises(ZonosInputError, match=r"segment 2 of 3 .* prefix takes 60 positions, the previous segment's "):
        segment_budget(192, 60, 130, segment="segment 2 of 3")
    with pytest.raises(ZonosInputError, match="previous segment's audio 123 and the delay pattern 9"):
        segment_budget(192, 60, 123)


def test_segments_that_leave_no_room_are_refused_before_any_work(model, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("generation ran for a text that cannot fit")

    monkeypatch.setattr(model, "submit", refuse)
    monkeypatch.setattr(model, "prepare_conditioning", refuse)
    long = "This segment goes on and on, with many more words than the tiny model's positions can hold. " * 2
    for stream in (False, True):
        with pytest.raises(ZonosInputError, match=r"segment 2 of 2: its text and the previous segment's take \d+ of"):
            speak_segments(model, [SEGMENTS[0], long], stream=stream)
    with pytest.raises(ZonosInputError, match="on_segment must be a function"):
        speak_segments(model, SEGMENTS, on_segment="print")


def _cond(model, text):
    return model.prepare_conditioning(make_cond_dict(text=text, language="en-us"))


@pytest.mark.parametrize("stream", [False, True])
def test_the_first_segment_continues_an_audio_prefix(model, stream):
    audio = torch.randint(0, 1024, (1, 9, 12), generator=torch.Generator().manual_seed(4))
    result = speak_segments(model, SEGMENTS[:2], stream=stream, audio_prefix_codes=audio, chunk_frames=4, **_kwargs(6))
    codes = torch.cat([c.codes for c in result], -1) if stream else result
    g = torch.Generator().manual_seed(6)
    first = model.generate(_cond(model, SEGMENTS[0]), audio_prefix_codes=audio, max_new_tokens=24,
                           progress_bar=False, generator=g)[..., 12:]  # fmt: skip
    second = model.generate(_cond(model, f"{SEGMENTS[0]} {SEGMENTS[1]}"), audio_prefix_codes=first,
                            max_new_tokens=24, progress_bar=False, generator=g)[..., first.shape[-1] :]  # fmt: skip
    assert torch.equal(codes, torch.cat([first, second], -1))  # the prefix's frames are not in the result


def test_an_audio_prefix_that_leaves_the_first_segment_no_room_is_refused_before_work(model, monkeypatch):
    monkeypatch.setattr(model, "submit", lambda *a, **k: pytest.fail("submitted a segment that cannot fit"))
    room = model.engine.max_seqlen - 9 - prefix_lengths(model, SEGMENTS)[0]
    audio = torch.zeros(1, 9, room, dtype=torch.long)
    for stream in (False, True):
        with pytest.raises(ZonosInputError, match=rf"segment 1 of 3: .* audio prefix {room} frames .* Shorten"):
            speak_segments(model, SEGMENTS, stream=stream, audio_prefix_codes=audio)
    assert longform_budget(model, SEGMENTS, prefix_frames=room - 1, max_new_tokens=50) == 1


def _full_for(model, monkeypatch, refusals: int):
    """model.submit refusing a later segment's first ``refusals`` tries as a full engine does: after the refused
    request drew its seed from the generator. Returns whether each call continued a previous segment."""
    submit, calls = model.submit, []

    def full_then_submit(prefix, **kwargs):
        calls.append(kwargs["audio_prefix_codes"] is not None)
        if calls[-1] and calls.count(True) <= refusals:
            torch.randint(0, 2**62, (1,), generator=kwargs["generator"])  # as the refused request drew its seed
            raise EngineFullError("the engine's queue is full")
        return submit(prefix, **kwargs)

    monkeypatch.setattr(model, "submit", full_then_submit)
    return calls


@pytest.mark.parametrize("stream", [False, True])
def test_a_later_segment_waits_for_room_in_a_full_engine(model, monkeypatch, stream):
    expected = speak_segments(model, SEGMENTS[:2], **_kwargs(8))
    calls = _full_for(model, monkeypatch, refusals=3)
    result = speak_segments(model, SEGMENTS[:2], stream=stream, **_kwargs(8))
    codes = torch.cat([c.codes for c in result], -1) if stream else result
    assert calls == [False, True, True, True, True]  # three refusals, then the segment ran
    assert torch.equal(codes, expected)  # waiting drew no extra seeds


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_engine_refuses_the_first_segment_at_once_and_a_later_one_after_full_wait(model, monkeypatch, stream):
    def full(*args, **kwargs):
        raise EngineFullError("the engine's queue is full")

    with monkeypatch.context() as m:
        m.setattr(model, "submit", full)
        with pytest.raises(EngineFullError, match="queue is full"):
            speak_segments(model, SEGMENTS, stream=stream, full_wait=30)  # streamed too: before the iterator
    _full_for(model, monkeypatch, refusals=10**6)
    started = time.monotonic()
    with pytest.raises(EngineFullError, match=r"segment 2 of 3: the engine stayed full for 0.2 s"):
        result = speak_segments(model, SEGMENTS, stream=stream, full_wait=0.2, **_kwargs(1))
        if stream:
            list(result)
    assert 0.2 <= time.monotonic() - started < 10
    assert _settled(model)


def _settled(model, timeout=10.0):
    deadline = time.monotonic() + timeout
    while model.engine.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    return not model.engine.busy


def test_closing_a_stream_before_reading_cancels_its_first_segment(model):
    stream = speak_segments(model, SEGMENTS, stream=True, **_kwargs(2))
    assert stream.handle is not None and not stream.handle.done
    stream.close()
    assert _settled(model)
    assert torch.equal(speak_segments(model, SEGMENTS[:1], **_kwargs(2)),
                       speak_segments(model, SEGMENTS[:1], **_kwargs(2)))  # fmt: skip
