"""The web demo's generation function on a tiny random model: streamed wav chunks concatenate to the one-shot
decode of the same seed, a closed (cancelled) request leaves the model ready, bad input raises gr.Error
with a helpful message, and the Blocks wire the function to the UI's controls."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import soundfile as sf
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
gr = pytest.importorskip("gradio")

import gradio_interface as gi  # noqa: E402
from tests.tiny import save_tiny_checkpoint, tiny_model  # noqa: E402
from zonos.conditioning import make_cond_dict  # noqa: E402
from zonos.model import Zonos  # noqa: E402

TEXT = "Hello, world!"
# The UI's inputs after (model_loader, model_name), with emotion switched on and a short max_new_tokens.
SETTINGS = dict(
    text=TEXT,
    language="en-us",
    speaker_audio=None,
    happiness=0.6,
    sadness=0.05,
    disgust=0.05,
    fear=0.05,
    surprise=0.05,
    anger=0.05,
    other=0.1,
    neutral=0.3,
    vq_score=0.7,
    fmax=22050.0,
    pitch_std=45.0,
    speaking_rate=15.0,
    dnsmos_ovrl=4.0,
    speaker_noised=False,
    unconditional_keys=[],
    cfg_scale=2.0,
    min_p=0.1,
    seed=11,
    randomize_seed=False,
    max_new_tokens=24,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("hybrid"))


@pytest.fixture
def loader(model, monkeypatch):
    """A ModelLoader serving the tiny model; records the names asked for."""
    monkeypatch.setattr(gi, "LOCK_TIMEOUT_S", 2.0)  # a lock left held fails fast instead of hanging

    def load(name: str) -> Zonos:
        load.calls.append(name)
        return model

    load.calls = []
    return load


def _run(loader, **overrides):
    return gi.synthesize(loader, "tiny", **{**SETTINGS, **overrides}, first_chunk_frames=2, chunk_frames=5)


def _pcm(update) -> np.ndarray:
    audio = update[0]
    assert isinstance(audio, bytes), audio
    data, sr = sf.read(io.BytesIO(audio), dtype="int16")
    assert sr == 44100 and data.ndim == 1 and data.size > 0
    return data


def _one_shot(model) -> np.ndarray:
    s = SETTINGS
    cond = make_cond_dict(
        text=TEXT,
        language="en-us",
        emotion=[s[k] for k in ("happiness", "sadness", "disgust", "fear", "surprise", "anger", "other", "neutral")],
        fmax=s["fmax"],
        pitch_std=s["pitch_std"],
        speaking_rate=s["speaking_rate"],
        vqscore_8=[s["vq_score"]] * 8,
        dnsmos_ovrl=s["dnsmos_ovrl"],
        speaker_noised=False,
        unconditional_keys=[],
        device="cpu",
    )
    codes = model.generate(
        model.prepare_conditioning(cond),
        max_new_tokens=s["max_new_tokens"],
        cfg_scale=s["cfg_scale"],
        sampling_params={"min_p": s["min_p"]},
        progress_bar=False,
        generator=torch.Generator().manual_seed(s["seed"]),
    )
    return model.autoencoder.decode(codes)[0, 0].numpy()


def _stream_pcm(updates) -> np.ndarray:
    chunks = [_pcm(u) for u in updates if isinstance(u[0], bytes)]
    assert len(chunks) >= 2  # streamed, not one piece
    return np.concatenate(chunks)


def test_stream_equals_one_shot_and_reports_time_to_first_audio(model, loader):
    updates = list(_run(loader))
    assert loader.calls == ["tiny"]
    ref = gi.to_int16(_one_shot(model))
    audio = _stream_pcm(updates)
    assert audio.shape == ref.shape
    # Exact streaming: the float chunks match the one-shot decode to ≥ 90 dB, so 16-bit samples agree to 1 LSB.
    assert np.abs(audio.astype(np.int32) - ref).max() <= 1
    assert updates[0][2] == SETTINGS["seed"] and all(u[2] == gr.update() for u in updates[1:])
    assert updates[0][1].startswith("first audio after ") and "seed 11" in updates[0][1]
    assert updates[-1][0] == gr.update() and "real time" in updates[-1][1]
    assert f"{ref.size / 44100:.2f} s of audio" in updates[-1][1]


def test_closing_early_leaves_the_model_ready(model, loader):
    stream = _run(loader, max_new_tokens=60)
    assert isinstance(next(stream)[0], bytes)
    stream.close()  # what Gradio does on Stop / a closed tab
    assert not gi._generation_lock.locked()
    ref = gi.to_int16(_one_shot(model))
    again = _stream_pcm(list(_run(loader)))
    assert again.shape == ref.shape and np.abs(again.astype(np.int32) - ref).max() <= 1


def test_randomized_seed_is_reported(loader):
    first = next(iter(_run(loader, randomize_seed=True, max_new_tokens=12)))
    assert isinstance(first[2], int) and 0 <= first[2] <= gi.MAX_SEED and f"seed {first[2]}" in first[1]


def _error(loader, **overrides) -> str:
    with pytest.raises(gr.Error) as err:
        list(_run(loader, **overrides))
    assert not gi._generation_lock.locked()
    return err.value.message


def test_bad_input_raises_gradio_errors(loader, tmp_path):
    assert "text is empty" in _error(loader, text="  \n")
    msg = _error(loader, language="English")
    assert "unsupported language" in msg and "en-us" in msg and "Language dropdown" in msg
    assert loader.calls == []  # checked before the model is loaded

    garbage = tmp_path / "voice.wav"
    garbage.write_bytes(b"not audio at all" * 64)
    assert "Could not read the speaker audio" in _error(loader, speaker_audio=str(garbage))
    assert "Could not read the speaker audio" in _error(loader, speaker_audio=str(tmp_path / "missing.wav"))
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(24000, dtype=np.float32), 24000)
    assert "silent" in _error(loader, speaker_audio=str(silent))
    short = tmp_path / "short.wav"
    sf.write(short, 0.3 * np.random.default_rng(0).standard_normal(2400).astype(np.float32), 24000)
    assert "too short" in _error(loader, speaker_audio=str(short))

    no_emotion = dict.fromkeys(("happiness", "sadness", "disgust", "fear", "surprise", "anger", "other", "neutral"), 0)
    assert "emotion" in _error(loader, **no_emotion)
    assert "max_seqlen" in _error(loader, max_new_tokens=1000)  # the tiny model holds 256 positions


def test_speaker_audio_clones(model, loader, tmp_path):
    """An uploaded clip goes through make_speaker_embedding (a tiny speaker network here) and is cached."""
    from tests.test_speaker import TINY, _speech_like, random_lda, random_state
    from zonos.speaker import SpeakerEmbedding

    clip = tmp_path / "voice.wav"
    sf.write(clip, _speech_like(1.0, 24000).numpy(), 24000)
    model.spk_clone_model = SpeakerEmbedding.from_state_dicts(random_state(TINY), random_lda(TINY), config=TINY)
    try:
        first = next(iter(_run(loader, speaker_audio=str(clip), max_new_tokens=12)))
        assert isinstance(first[0], bytes)
        assert len(gi._speaker_cache) == 1
    finally:
        model.spk_clone_model = None
        gi._speaker_cache.clear()


def test_build_demo_wires_synthesize(model, loader):
    demo = gi.build_demo(loader, ["tiny", "other"], first_chunk_frames=2, chunk_frames=5)
    assert isinstance(demo, gr.Blocks)
    fns = demo.fns.values() if isinstance(demo.fns, dict) else demo.fns
    (fn,) = [f for f in fns if f.api_name == "synthesize"]
    audio, status, seed = fn.outputs
    assert isinstance(audio, gr.Audio) and audio.streaming and isinstance(status, gr.Textbox)
    # Call the wired function with the UI's default values, shortened, as the browser would.
    values = {c.label: c.value for c in fn.inputs}
    assert values["Model"] == "tiny" and values["Language code"] == "en-us" and len(values) == len(fn.inputs)
    overrides = {"Text to synthesize": TEXT, "Max new tokens (86 ≈ one second)": 12, "Randomize seed": False}
    updates = list(fn.fn(*[overrides.get(c.label, c.value) for c in fn.inputs]))
    assert loader.calls == ["tiny"] and updates[0][2] == 420
    assert sum(isinstance(u[0], bytes) for u in updates) >= 1 and "real time" in updates[-1][1]


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        gi.parse_args(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--codec", "--device", "--share", "--port", "--host", "--chunk-frames"):
        assert flag in out
    args = gi.parse_args(["--model", "./a", "--model", "b/c", "--port", "8000", "--share"])
    assert args.model == ["./a", "b/c"] and args.port == 8000 and args.share
    assert gi.parse_args([]).model == list(gi.DEFAULT_MODELS)


def test_model_cache_and_main(model, tmp_path, monkeypatch):
    """ModelCache loads a local directory once, swaps models on demand; main() preloads and launches."""
    from zonos.codec import DACAutoencoder as PublicDAC

    codec_loads = []

    def load_codec(name, device):
        codec_loads.append(name)
        return model.autoencoder

    monkeypatch.setattr(PublicDAC, "from_pretrained", staticmethod(load_codec))
    a, b = tmp_path / "a", tmp_path / "b"
    for path, seed in ((a, 0), (b, 1)):
        path.mkdir()
        save_tiny_checkpoint(path, "transformer", seed=seed)
    cache = gi.ModelCache(codec="my/codec", device="cpu")
    assert not cache.warmup  # on by default only on CUDA
    first = cache(str(a))
    assert cache(str(a)) is first and first.autoencoder is model.autoencoder
    first.spk_clone_model = marker = object()
    second = cache(str(b))
    assert second is not first and second.spk_clone_model is marker and codec_loads == ["my/codec"]

    launched = {}
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: launched.update(kw))
    assert gi.main(["--model", str(a), "--device", "cpu", "--port", "7999", "--codec", "x/y"]) == 0
    assert launched == {"server_name": "127.0.0.1", "server_port": 7999, "share": False}


def test_model_cache_warms_up_with_the_demo_schedule(model, tmp_path, monkeypatch, capsys):
    from zonos.codec import DACAutoencoder as PublicDAC

    monkeypatch.setattr(PublicDAC, "from_pretrained", staticmethod(lambda name, device: model.autoencoder))
    calls = []
    monkeypatch.setattr(gi.Zonos, "warmup", lambda self, **kw: calls.append(kw) or 1.5)
    save_tiny_checkpoint(tmp_path, "hybrid")
    gi.ModelCache(device="cpu", warmup=True, first_chunk_frames=3, chunk_frames=5)(str(tmp_path))
    assert calls == [{"all_prefill_lengths": True, "first_chunk_frames": 3, "chunk_frames": 5}]
    assert "warmed up" in capsys.readouterr().out
    assert gi.parse_args(["--no-warmup"]).no_warmup
