"""Long-form speech (CPU, tiny model): segments stream as one utterance whose audio equals the one-shot decode of
all segments' codes, and each segment's codes are those of generating it with the previous codes as prefix."""

import pytest
import torch

from tests.tiny import tiny_model
from zonos.conditioning import make_cond_dict
from zonos.errors import ZonosInputError
from zonos.longform import speak_segments

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
    with pytest.raises(ZonosInputError, match="audio_prefix_codes"):
        speak_segments(model, SEGMENTS, audio_prefix_codes=None)
