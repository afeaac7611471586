"""The web demo on a tiny random model, served for real (uvicorn on a free port): the stream route's PCM
concatenates to the one-shot decode of the same seed and sampler settings, long text is split as the CLI splits
it and streamed as one utterance, a segment cut off at its frame budget is reported, a closed connection stops
generation (or takes a waiting request out of line) and leaves the model ready, bad input answers with its
message, no route reads a file that was not uploaded, prefix and speaker clips are used, the Gradio API has
named parameters and returns audio to gradio_client, and the page offers the accelerator toggles only where
they can run."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
gr = pytest.importorskip("gradio")

import gradio_interface as gi  # noqa: E402
from tests.tiny import save_tiny_checkpoint, tiny_model  # noqa: E402
from zonos.conditioning import make_cond_dict  # noqa: E402
from zonos.conditioning.segments import split_text  # noqa: E402
from zonos.errors import ZonosInputError  # noqa: E402
from zonos.longform import longform_budget, speak_segments  # noqa: E402
from zonos.model import Zonos  # noqa: E402

TEXT = "Hello, world!"
# Non-default values for every control the reference below passes to generate, so a control the demo
# dropped would change the audio.
SETTINGS = dict(
    text=TEXT,
    language="en-us",
    happiness=0.6,
    neutral=0.3,
    vq_score=0.7,
    fmax=20000.0,
    pitch_std=50.0,
    speaking_rate=14.0,
    dnsmos_ovrl=3.5,
    unconditional_keys=[],
    cfg_scale=2.5,
    temperature=0.9,
    linear=0.6,
    conf=0.3,
    quad=0.05,
    top_p=0.95,
    top_k=200,
    min_p=0.02,
    repetition_penalty=2.0,
    seed=11,
    randomize_seed=False,
    max_new_tokens=24,
)
SCHEDULE = dict(first_chunk_frames=2, chunk_frames=5)
# 1,137 characters: five segments of split_text's default size. As one prefix (~1,150 tokens) it does not fit the
# long model's 1,024 positions; two segments' texts (~550) leave each segment 231 frames.
LONG_TEXT = " ".join(
    f"Sentence number {i} is here to make the text long enough to need several segments." for i in range(14)
)


@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free localhost port in a thread; yields its base URL."""
    import uvicorn

    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets that say TCP, and with Nagle's
    # algorithm on every response waited ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the demo server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("hybrid"))


@pytest.fixture(scope="module")
def uploads(tmp_path_factory):
    """Gradio's upload folder for this module's apps (clips outside it are refused by the stream route)."""
    folder = tmp_path_factory.mktemp("uploads")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADIO_TEMP_DIR", str(folder))
        yield folder


@contextlib.contextmanager
def demo_server(model) -> Iterator[type]:
    """The demo served on ``model``; ``server.loads`` records the model names asked for."""

    def load(name: str) -> Zonos:
        load.calls.append(name)
        return model

    load.calls = []
    app = gi.build_app(load, ["tiny"], device="cpu", **SCHEDULE)
    with serve(app) as url:
        yield type("Server", (), {"url": url, "loads": load.calls})


@pytest.fixture(scope="module")
def server(model, uploads):
    with demo_server(model) as s:
        yield s


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("long"), max_seqlen=1024)


@pytest.fixture(scope="module")
def long_server(long_model, uploads):
    with demo_server(long_model) as s:
        yield s


@pytest.fixture(autouse=True)
def _short_lock_wait(monkeypatch):
    monkeypatch.setattr(gi, "LOCK_TIMEOUT_S", 5.0)  # a lock left held fails fast instead of hanging


def _post(server, **overrides) -> httpx.Response:
    return httpx.post(server.url + "zonos/stream", json={**SETTINGS, **overrides}, timeout=60)


def _stream(server, **overrides) -> tuple[list[dict], np.ndarray]:
    resp = _post(server, **overrides)
    assert resp.status_code == 200, resp.text
    items = gi.decode_frames(resp.content)
    events = [i for i in items if isinstance(i, dict)]
    chunks = [i for i in items if isinstance(i, np.ndarray)]
    assert len(chunks) >= 2  # streamed, not one piece
    return events, np.concatenate(chunks)


def _named(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["event"] == name]


def _reference(overrides: dict) -> tuple[dict, dict, dict]:
    """(settings, make_cond_dict's arguments but the text, generate's sampling arguments) of a request."""
    s = {**dict(gi.SynthesisRequest().__dict__), **SETTINGS, **overrides}
    request = gi.SynthesisRequest.from_mapping(s)
    cond = dict(
        language="en-us",
        emotion=request.emotion(),
        fmax=s["fmax"],
        pitch_std=s["pitch_std"],
        speaking_rate=s["speaking_rate"],
        vqscore_8=[s["vq_score"]] * 8,
        dnsmos_ovrl=s["dnsmos_ovrl"],
        speaker_noised=False,
        unconditional_keys=s["unconditional_keys"],
        device="cpu",
    )
    sampling = {k: s[k] for k in ("temperature", "linear", "conf", "quad", "top_p", "top_k", "min_p")}
    generation = dict(
        cfg_scale=s["cfg_scale"],
        sampling_params={**sampling, "repetition_penalty": s["repetition_penalty"]},
        progress_bar=False,
        generator=torch.Generator().manual_seed(s["seed"]),
    )
    return s, cond, generation


def _one_shot(model, audio_prefix_codes=None, speaker=None, **overrides) -> np.ndarray:
    s, cond, generation = _reference(overrides)
    codes = model.generate(
        model.prepare_conditioning(make_cond_dict(text=s["text"], speaker=speaker, **cond)),
        audio_prefix_codes=audio_prefix_codes,
        max_new_tokens=s["max_new_tokens"],
        **generation,
    )
    return model.autoencoder.decode(codes)[0, 0].numpy()


def _assert_same_audio(audio: np.ndarray, ref: np.ndarray) -> None:
    assert audio.dtype == np.float32 and audio.shape == ref.shape and np.abs(ref).max() > 1e-3
    noise = np.sum((audio.astype(np.float64) - ref) ** 2)
    assert 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(noise, 1e-30)) >= 90


def test_stream_equals_one_shot_and_reports_its_timing(model, server):
    events, audio = _stream(server)
    _assert_same_audio(audio, _one_shot(model))
    start, first, *progress, done = events
    assert start["event"] == "start" and start["seed"] == 11 and start["sample_rate"] == 44100
    assert start["device"] == "cpu" and start["prefix_frames"] == 0
    assert start["segments"] == 1 and start["budget"] == SETTINGS["max_new_tokens"]
    assert first["event"] == "first_audio" and 0 < first["generation_ms"] < first["ttfa_ms"]
    assert len(progress) >= 2 and {e["event"] for e in progress} == {"progress"}
    fractions = [e["fraction"] for e in progress]
    assert fractions == sorted(fractions) and 0 < fractions[0] < 1 and all(e["segment"] == 1 for e in progress)
    assert done["event"] == "done" and not done["stopped"] and done["samples"] == audio.size
    assert done["seconds"] == pytest.approx(audio.size / 44100) and done["rtf"] > 0
    assert abs(done["t_end_wall_ms"] - time.time() * 1000) < 30_000
    assert server.loads[-1] == "tiny"
    # The random model never samples EOS in 24 frames: the budget ended it, and the page must say so.
    assert done["cut_off"] == [1] and fractions[-1] == 1.0
    assert done["warning"] == (
        "the text reached Max new tokens (24 frames, 0.3 s) before the model ended it, so the audio may stop "
        "early; raise Max new tokens (under Sampling) or try another seed."
    )


def test_long_text_is_split_and_streamed_as_one_utterance(long_model, long_server):
    """Text whose prefix alone is past the model's positions is split as `zonos-tts speak` splits it and streams
    the audio of speak_segments with the budget longform_budget gives every segment."""
    events, audio = _stream(long_server, text=LONG_TEXT, max_new_tokens=10)
    s, cond, generation = _reference({"text": LONG_TEXT})
    segments = split_text(LONG_TEXT)
    budget = longform_budget(long_model, segments, "en-us", 10)
    codes = speak_segments(long_model, segments, cond=cond, max_new_tokens=budget, **generation)
    _assert_same_audio(audio, long_model.autoencoder.decode(codes)[0, 0].numpy())
    assert len(segments) == 5 and budget == 10 and codes.shape[-1] == 50
    (start,) = _named(events, "start")
    assert start["segments"] == 5 and start["budget"] == 10
    progress = _named(events, "progress")
    assert [e["segment"] for e in progress] == sorted(e["segment"] for e in progress)
    assert {e["segment"] for e in progress} == {1, 2, 3, 4, 5} and progress[-1]["fraction"] == 1.0
    assert all(0 < e["fraction"] <= 1 for e in progress)
    (done,) = _named(events, "done")
    assert done["cut_off"] == [1, 2, 3, 4, 5] and done["samples"] == audio.size
    assert done["warning"].startswith("every segment of 5 reached Max new tokens (10 frames, 0.1 s) before the model")


def test_a_budget_past_the_positions_is_capped_and_reported(server):
    """max_new_tokens past what the tiny model's 256 positions leave is capped there (as the CLI caps it), and
    the cut-off names the positions, not Max new tokens."""
    text = "A sentence of about one hundred and fifty characters, long enough that its prefix takes a good part of the "
    events, audio = _stream(server, text=text + "positions.", max_new_tokens=1000)
    (start,) = _named(events, "start")
    (done,) = _named(events, "done")
    assert 0 < start["budget"] < 1000 and done["cut_off"] == [1] and audio.size > 0
    assert done["warning"].startswith(f"the text reached the {start['budget']} frames (")
    assert "the model's positions leave it" in done["warning"]


def test_cut_off_warning_names_the_segments_and_the_limit():
    assert gi._cut_off_warning([], 3, 100, 100, 0) is None
    assert gi._cut_off_warning([2], 3, 100, 100, 0).startswith("segment 2 of 3 reached Max new tokens (100 frames")
    assert gi._cut_off_warning([1, 3], 3, 100, 200, 0).startswith("segments 1, 3 of 3 reached the 100 frames")
    assert gi._cut_off_warning([1], 1, 50, 200, 44).endswith("; use a shorter prefix clip.")


def test_randomized_seed_is_reported(server):
    events, _ = _stream(server, randomize_seed=True, max_new_tokens=12)
    seeds = {e["seed"] for e in events if "seed" in e}
    assert len(seeds) == 1 and 0 <= seeds.pop() <= gi.MAX_SEED


def test_closing_the_connection_stops_generation_and_leaves_the_model_ready(model, server):
    # 215 frames take ~4 s on a 2-core CPU; a disconnect must end the request within a decode step or two.
    with httpx.stream("POST", server.url + "zonos/stream", json={**SETTINGS, "max_new_tokens": 215}) as resp:
        assert resp.status_code == 200
        next(resp.iter_bytes())  # the start and first-audio frames are there: generation is running
    deadline = time.monotonic() + 1.5
    while gi._generation_lock.locked():
        assert time.monotonic() < deadline, "the closed request still holds the model"
        time.sleep(0.01)
    _, again = _stream(server)
    _assert_same_audio(again, _one_shot(model))


def test_closing_a_long_text_stream_frees_the_model_within_a_second(long_model, long_server):
    """speak_segments takes no callback: the demo stops it at the next chunk, well before the ~1,000 frames (about
    15 s on a 2-core CPU) the five segments would take."""
    body = {**SETTINGS, "text": LONG_TEXT, "max_new_tokens": 200}
    with httpx.stream("POST", long_server.url + "zonos/stream", json=body) as resp:
        assert resp.status_code == 200
        next(resp.iter_bytes())
    deadline = time.monotonic() + 1.0
    while gi._generation_lock.locked():
        assert time.monotonic() < deadline, "the closed long-text request still holds the model"
        time.sleep(0.01)


def _first_frames(resp: httpx.Response) -> Iterator[dict | np.ndarray]:
    """The frames of a streamed response as they arrive."""
    buf = b""
    for data in resp.iter_raw():
        buf += data
        while len(buf) >= gi.FRAME_HEADER.size:
            size = gi.FRAME_HEADER.unpack_from(buf)[1] + gi.FRAME_HEADER.size
            if len(buf) < size:
                break
            yield from gi.decode_frames(buf[:size])
            buf = buf[size:]


def test_a_waiting_request_shows_its_place_and_leaves_the_line_when_closed(model, server):
    """While another request holds the model, a request is answered at once with its place in line; closed, it
    leaves the line without ever taking the model, and the next request runs at once."""
    assert gi._generation_lock.acquire(timeout=1)  # another request generating
    try:
        calls = len(server.loads)
        with httpx.stream("POST", server.url + "zonos/stream", json=SETTINGS, timeout=10) as resp:
            assert resp.status_code == 200
            assert next(_first_frames(resp)) == {"event": "queued", "ahead": 1}
            assert gi._generation_lock.waiting() == 1
        deadline = time.monotonic() + 1.0
        while gi._generation_lock.waiting():
            assert time.monotonic() < deadline, "the closed request is still in line"
            time.sleep(0.01)
    finally:
        gi._generation_lock.release()
    assert not gi._generation_lock.locked() and len(server.loads) == calls
    _, audio = _stream(server)
    _assert_same_audio(audio, _one_shot(model))


def test_requests_take_the_model_in_arrival_order():
    line = gi._Line()
    assert line.acquire(timeout=1)
    turns = [line.join() for _ in range(3)]
    waits = [turn.wait(5) for turn in turns]
    assert [next(w) for w in waits] == [1, 2, 3]
    line.release()
    assert list(waits[0]) == [] and turns[0].held
    assert next(waits[1]) == 1 and next(waits[2]) == 2  # one ahead each now
    cancel = threading.Event()
    cancel.set()
    turns[1].leave()
    assert list(turns[2].wait(5, cancel)) == [] and not turns[2].held and not line.waiting()
    turns[0].leave()
    assert not line.locked()


def test_cancel_ends_the_stream_as_stopped(model):
    cancel = threading.Event()
    request = gi.SynthesisRequest.from_mapping({**SETTINGS, "max_new_tokens": 200})
    samples, done = 0, None
    for item in gi.synthesis_events(lambda name: model, ["tiny"], request, cancel=cancel, **SCHEDULE):
        if isinstance(item, np.ndarray):
            samples += item.size
            cancel.set()
        elif item["event"] == "done":
            done = item
    assert done["stopped"] and done["samples"] == samples and samples < 200 * 512
    assert done["cut_off"] == [] and done["warning"] is None  # stopped, not cut off
    assert not gi._generation_lock.locked()


def _error(server, status: int = 400, **overrides) -> str:
    resp = _post(server, **overrides)
    assert resp.status_code == status, resp.text
    assert not gi._generation_lock.locked()
    return resp.json()["error"]


def test_bad_input_answers_with_its_message(server, uploads):
    calls = len(server.loads)
    assert _error(server, text="  \n") == "The text is empty: type the sentence to speak."
    msg = _error(server, language="English")
    assert "unsupported language" in msg and "en-us" in msg and "Language dropdown" in msg
    assert "top_k must be a whole number" in _error(server, top_k=1.5)
    assert "cfg_scale must be a finite number" in _error(server, cfg_scale="2")
    assert "randomize_seed must be true or false" in _error(server, randomize_seed=1)
    assert "unknown request field(s) ['voice']" in _error(server, voice="x")
    assert "Unknown model 'other'" in _error(server, model_name="other")
    assert "The text is 5,000 characters; the demo speaks at most 4,096" in _error(server, text="word " * 1000)
    assert len(server.loads) == calls  # all checked before the model is asked for

    garbage = uploads / "voice.wav"
    garbage.write_bytes(b"not audio at all" * 64)
    for msg, kind in (
        (_error(server, speaker_audio=str(garbage)), "speaker"),
        (_error(server, prefix_audio=str(garbage)), "prefix"),
        (_error(server, speaker_audio=str(uploads / "missing.wav")), "speaker"),
    ):
        assert msg.startswith(f"Could not read the {kind} audio") and str(uploads) not in msg, msg
    silent = uploads / "silent.wav"
    sf.write(silent, np.zeros(24000, dtype=np.float32), 24000)
    assert "silent" in _error(server, speaker_audio=str(silent))
    short = uploads / "short.wav"
    sf.write(short, 0.3 * np.random.default_rng(0).standard_normal(2400).astype(np.float32), 24000)
    assert "too short" in _error(server, speaker_audio=str(short))
    long = uploads / "long.flac"  # 10 minutes in a few KB: only MAX_PREFIX_SECONDS of it are decoded
    with sf.SoundFile(long, "w", 8000, 1, "PCM_16", format="FLAC") as f:
        for _ in range(60):
            f.write(np.full(80_000, 0.1, dtype=np.float32))
    assert gi._read_clip("prefix", str(long), gi.MAX_PREFIX_SECONDS)[0].shape == (1, 8000 * 30)
    low = uploads / "low.wav"  # a header claiming 1 kHz: the library bounds the resampling cost
    sf.write(low, 0.3 * np.random.default_rng(0).standard_normal(2000).astype(np.float32), 1000)
    assert "sample rate 1000 Hz is outside" in _error(server, prefix_audio=str(low))

    no_emotion = dict.fromkeys(("happiness", "sadness", "disgust", "fear", "surprise", "anger", "other", "neutral"), 0)
    assert "emotion" in _error(server, **no_emotion)
    assert "top_p" in _error(server, top_p=1.5)  # the sampler's own check, shown as it is
    # One segment whose prefix alone is past the tiny model's 256 positions; then two too long to share them.
    assert "max_seqlen 256" in _error(server, text="word " * 59)
    assert "leaving no room for audio" in _error(server, text="word " * 200)
    resp = httpx.post(server.url + "zonos/stream", content=b"{" + b" " * gi.MAX_REQUEST_BYTES + b"}")
    assert resp.status_code == 413 and "over 65536 bytes" in resp.json()["error"]
    resp = httpx.post(server.url + "zonos/stream", content=b'{"seed": 1' + b"0" * 400 + b"}")
    assert resp.status_code == 400 and "seed must be a finite number" in resp.json()["error"]
    resp = httpx.post(server.url + "zonos/stream", content=b"{")
    assert resp.status_code == 400 and "property name" in resp.json()["error"]  # the JSON parser's message
    assert "JSON object" in httpx.post(server.url + "zonos/stream", json=[1]).json()["error"]


def test_a_request_that_waits_too_long_ends_with_busy(server):
    assert gi._generation_lock.acquire(timeout=1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gi, "LOCK_TIMEOUT_S", 0.3)
            resp = _post(server)
    finally:
        gi._generation_lock.release()
    queued, error = gi.decode_frames(resp.content)
    assert resp.status_code == 200 and queued == {"event": "queued", "ahead": 1}
    assert error["event"] == "error" and "busy with other requests for 0 s" in error["message"]
    assert not gi._generation_lock.locked()


def _file(path) -> dict:
    """A Gradio file object, as the page and gradio_client send an uploaded file."""
    return {"path": str(path), "meta": {"_type": "gradio.FileData"}}


def test_no_route_reads_a_file_that_was_not_uploaded(server, uploads, tmp_path):
    """The Gradio API (whose file objects Gradio copies into its cache, where they can be downloaded) and the
    stream route read only files uploaded to the app; the refusal names no server path."""
    secret = tmp_path / "secret.wav"
    sf.write(secret, 0.3 * np.random.default_rng(0).standard_normal(24000).astype(np.float32), 24000)
    d = gi.SynthesisRequest(max_new_tokens=4)
    names = [f.name for f in gi.dataclasses.fields(d)]
    for path in (secret, uploads / ".." / secret.name, "relative.wav"):
        for field in ("speaker_audio", "prefix_audio"):
            data = [gi._api_default(name, d) for name in names]
            data[names.index(field)] = _file(path)
            resp = httpx.post(server.url + "gradio_api/call/synthesize", json={"data": data})
            assert resp.status_code == 400, resp.text
            msg = resp.json()["error"]
            assert msg.startswith("The file is not a file uploaded to this demo") and "/" not in msg.split(";")[0]
            for body in ({**SETTINGS, field: str(path)}, {**SETTINGS, field: _file(path)}):
                resp = httpx.post(server.url + "zonos/stream", json=body)
                assert resp.status_code == 400 and "is not a file uploaded to this demo" in resp.json()["error"]
                assert str(tmp_path) not in resp.text and str(uploads) not in resp.text
    copies = [p for p in uploads.rglob("*") if p.is_file() and p.read_bytes() == secret.read_bytes()]
    assert copies == [] and not gi._generation_lock.locked()


def test_prefix_audio_is_continued(model, server, uploads):
    clip = uploads / "prefix.wav"
    rng = np.random.default_rng(1)
    sf.write(clip, 0.3 * rng.standard_normal((12000, 2)).astype(np.float32), 24000)  # stereo, resampled
    events, audio = _stream(server, prefix_audio={"path": str(clip), "orig_name": "prefix.wav"})  # a FileData
    wav = torch.from_numpy(sf.read(clip, dtype="float32")[0].T.copy()).mean(0, keepdim=True)
    codes = model.autoencoder.encode(model.autoencoder.preprocess(wav, 24000)[None])
    assert codes.shape[-1] > 10 and events[0]["prefix_frames"] == codes.shape[-1]
    _assert_same_audio(audio, _one_shot(model, audio_prefix_codes=codes))
    assert len([k for k in gi._upload_cache if k[0] == "prefix"]) == 1
    (done,) = _named(events, "done")
    assert done["cut_off"] == [1]  # the budget counts new frames, not the prefix clip's
    # A text whose 228 prefix tokens fit the 256 positions, but not with the clip's 44 frames besides.
    msg = _error(server, text="word " * 36, prefix_audio=str(clip))
    assert re.fullmatch(
        r"The text takes 2\d\d of the model's 256 positions and the prefix audio 44, which leaves no room for new "
        r"audio: use a shorter prefix clip or shorter text\.",
        msg,
    ), msg


def test_long_text_continues_a_prefix_clip(long_model, long_server, uploads):
    """A prefix clip leads the first segment of a long text: the stream is speak_segments' with the clip's codes
    as its audio prefix, which the budget counts."""
    clip = uploads / "long-prefix.wav"
    sf.write(clip, 0.3 * np.random.default_rng(2).standard_normal(8000).astype(np.float32), 16000)
    events, audio = _stream(long_server, text=LONG_TEXT, max_new_tokens=10, prefix_audio=str(clip))
    wav = torch.from_numpy(sf.read(clip, dtype="float32")[0][None].copy())
    codes = long_model.autoencoder.encode(long_model.autoencoder.preprocess(wav, 16000)[None])
    s, cond, generation = _reference({"text": LONG_TEXT})
    segments = split_text(LONG_TEXT)
    budget = longform_budget(long_model, segments, "en-us", 10, prefix_frames=codes.shape[-1])
    spoken = speak_segments(long_model, segments, cond=cond, max_new_tokens=budget, audio_prefix_codes=codes,
                            **generation)  # fmt: skip
    _assert_same_audio(audio, long_model.autoencoder.decode(spoken)[0, 0].numpy())
    (start,) = _named(events, "start")
    assert start["segments"] == 5 and start["prefix_frames"] == codes.shape[-1] > 10 and spoken.shape[-1] == 50
    plain = speak_segments(long_model, segments, cond=cond, max_new_tokens=budget, **_reference({})[2])
    assert not torch.equal(plain[..., :10], spoken[..., :10])  # the clip changed what the first segment says


def test_speaker_audio_clones(model, server, uploads):
    """An uploaded clip goes through make_speaker_embedding (a tiny speaker network here) and is cached."""
    from tests.test_speaker import TINY, _speech_like, random_lda, random_state
    from zonos.speaker import SpeakerEmbedding

    clip = uploads / "speaker.wav"
    sf.write(clip, _speech_like(1.0, 24000).numpy(), 24000)
    model.spk_clone_model = SpeakerEmbedding.from_state_dicts(random_state(TINY), random_lda(TINY), config=TINY)
    try:
        _, audio = _stream(server, speaker_audio=str(clip), max_new_tokens=12)
        speaker = model.make_speaker_embedding(*gi._read_clip("speaker", str(clip), 30.0))
        _assert_same_audio(audio, _one_shot(model, speaker=speaker, max_new_tokens=12))
        assert len([k for k in gi._upload_cache if k[0] == "speaker"]) == 1
        low = uploads / "low-speaker.wav"
        sf.write(low, _speech_like(2.0, 4000).numpy(), 4000)
        assert "sample rate 4000 Hz is outside" in _error(server, speaker_audio=str(low))
    finally:
        model.spk_clone_model = None
        gi._upload_cache.clear()


def test_uploads_are_bounded(server):
    big = b"RIFF" + bytes(gi.MAX_UPLOAD_BYTES)
    resp = httpx.post(server.url + "gradio_api/upload", files={"files": ("big.wav", big)}, timeout=60)
    assert resp.status_code == 413 and "maximum allowed size" in resp.text
    small = httpx.post(server.url + "gradio_api/upload", files={"files": ("small.wav", b"RIFF")}, timeout=60)
    assert small.status_code == 200


def test_page_serves_the_player_from_its_static_file(server):
    page = httpx.get(server.url).text
    assert "zonos/player.js" in page  # in the page's config: Gradio's frontend adds it to the head
    js = httpx.get(server.url + "zonos/player.js")
    assert js.headers["content-type"].startswith("text/javascript") and "window.zonosPlayer" in js.text
    source = Path(gi.__file__).parent / "zonos" / "demo_static" / "player.js"
    assert js.text == source.read_text(encoding="utf-8") == gi.PLAYER_JS_PATH.read_text(encoding="utf-8")
    assert not hasattr(gi, "PLAYER_JS") and "new AudioContext" not in Path(gi.__file__).read_text(encoding="utf-8")


def test_the_player_ships_with_the_package():
    """The wheel (and so the Docker image, which pip-installs the checkout) holds the player as package data."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((Path(gi.__file__).parent / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["zonos"]
    assert any(fnmatch.fnmatch("demo_static/player.js", pattern) for pattern in patterns)


def test_gradio_client_gets_audio_from_named_parameters(model, server, tmp_path):
    client_mod = pytest.importorskip("gradio_client")
    client = client_mod.Client(server.url, verbose=False)
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/synthesize"]
    names = [p["parameter_name"] for p in info["parameters"]]
    assert names == [f.name for f in gi.dataclasses.fields(gi.SynthesisRequest)]
    defaults = {p["parameter_name"]: p.get("parameter_default") for p in info["parameters"]}
    assert defaults["max_new_tokens"] == 86 * 30 and defaults["linear"] == 0.5 and defaults["text"] == gi.DEFAULT_TEXT
    path = client.predict(**SETTINGS, api_name="/synthesize")
    audio, sr = sf.read(path, dtype="int16")
    assert sr == 44100
    ref = gi.to_int16(_one_shot(model))
    assert audio.shape == ref.shape and np.abs(audio.astype(np.int32) - ref).max() <= 1
    # A clip sent with handle_file is uploaded first, so the API reads it.
    clip = tmp_path / "prefix.wav"
    sf.write(clip, 0.3 * np.random.default_rng(2).standard_normal(12000).astype(np.float32), 24000)
    path = client.predict(**SETTINGS, prefix_audio=client_mod.handle_file(str(clip)), api_name="/synthesize")
    wav = torch.from_numpy(sf.read(clip, dtype="float32")[0][None].copy())
    codes = model.autoencoder.encode(model.autoencoder.preprocess(wav, 24000)[None])
    ref = gi.to_int16(_one_shot(model, audio_prefix_codes=codes))
    audio, _ = sf.read(path, dtype="int16")
    assert audio.shape == ref.shape and np.abs(audio.astype(np.int32) - ref).max() <= 1
    with pytest.raises(Exception, match="The text is empty"):  # the message itself, not a generic error
        client.predict(text=" ", api_name="/synthesize")


def test_cancelling_a_gradio_api_call_frees_the_model_within_a_second(server):
    """Gradio's cancel route (what its page calls for a cancelled event) stops /synthesize's generation: 215 frames
    take ~4 s on a 2-core CPU."""
    config = httpx.get(server.url + "config").json()
    (fn_index,) = [d["id"] for d in config["dependencies"] if d.get("api_name") == "synthesize"]
    d = gi.SynthesisRequest(max_new_tokens=215, randomize_seed=False)
    data = [gi._api_default(f.name, d) for f in gi.dataclasses.fields(d)]
    session = {"session_hash": "cancel-test", "fn_index": fn_index}
    event = httpx.post(server.url + "gradio_api/queue/join", json={**session, "data": data, "event_data": None})
    deadline = time.monotonic() + 10
    while not gi._generation_lock.locked():
        assert time.monotonic() < deadline, "the API call did not start"
        time.sleep(0.01)
    time.sleep(0.2)  # generating
    resp = httpx.post(server.url + "gradio_api/cancel", json={**session, "event_id": event.json()["event_id"]})
    assert resp.status_code == 200
    deadline = time.monotonic() + 1.0
    while gi._generation_lock.locked():
        assert time.monotonic() < deadline, "the cancelled API call still holds the model"
        time.sleep(0.01)


def test_request_fields_and_types():
    r = gi.SynthesisRequest.from_mapping({"top_k": 5.0, "seed": 7, "unconditional_keys": ["speaker"], "fmax": 100})
    assert r.top_k == 5 and isinstance(r.top_k, int) and r.fmax == 100.0 and r.unconditional_keys == ("speaker",)
    assert r.sampling_params()["top_k"] == 5 and r.sampling_params()["linear"] == 0.5
    assert gi.SynthesisRequest.from_mapping({"speaker_audio": ""}).speaker_audio is None
    for bad in ({"seed": float("nan")}, {"top_k": True}, {"text": 3}, {"unconditional_keys": "speaker"},
                {"seed": 10**400}, {"cfg_scale": -(10**400)}):  # fmt: skip
        with pytest.raises(ZonosInputError, match=next(iter(bad))):
            gi.SynthesisRequest.from_mapping(bad)
    frames = gi.encode_frame(gi.FRAME_EVENT, json.dumps({"event": "x"}).encode()) + gi._frame(np.ones(3, np.float32))
    assert gi.decode_frames(frames)[0] == {"event": "x"} and gi.decode_frames(frames)[1].tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="truncated"):
        gi.decode_frames(frames[:-1])


def _components(demo):
    return [b for b in demo.blocks.values()]


def test_page_has_examples_a_counter_and_a_live_status_line(model):
    demo = gi.build_demo(lambda name: model, ["tiny"], device="cpu")
    (examples,) = [c for c in _components(demo) if isinstance(c, gr.Dataset)]
    assert [row[:2] for row in examples.samples] == [list(e) for e in gi.EXAMPLES]
    assert any(len(text) > gi.DEFAULT_MAX_CHARS for text, _ in gi.EXAMPLES)  # one shows long text
    (text,) = [c for c in _components(demo) if isinstance(c, gr.Textbox) and c.elem_id == "zonos-text"]
    assert text.max_length == gi.MAX_TEXT_CHARS
    assert [c.elem_id for c in _components(demo) if isinstance(c, gr.Number)] == ["zonos-seed"]
    html = " ".join(c.value for c in _components(demo) if isinstance(c, gr.HTML))
    assert 'id="zonos-chars"' in html and f'data-max="{gi.MAX_TEXT_CHARS}"' in html
    assert '<div id="zonos-status" role="status" aria-live="polite"' in html and '<progress id="zonos-progress"' in html


def test_accelerator_toggles_are_disabled_on_the_cpu(model):
    demo = gi.build_demo(lambda name: model, ["tiny"], device="cpu")
    toggles = [
        c
        for c in _components(demo)
        if isinstance(c, gr.Checkbox) and c.label in ("CuTe GEMV", "CUDA graphs", "Fast ops")
    ]
    assert len(toggles) == 3
    assert all(not t.interactive and not t.value and "needs a CUDA GPU" in t.info for t in toggles)
    assert any(isinstance(c, gr.Markdown) and "device **cpu**" in c.value for c in _components(demo))


def test_accelerator_toggles_switch_on_cuda(model, monkeypatch):
    """On a CUDA device the toggles call the loader's set_accelerators (stubbed: this machine has no GPU)."""
    calls = []

    class Loader:
        device = torch.device("cuda")
        accelerators = {"use_cute_gemv": True, "cuda_graphs": None, "fast_ops": False}

        def __call__(self, name):
            return model

        def set_accelerators(self, name, **flags):
            calls.append((name, flags))

    demo = gi.build_demo(Loader(), ["tiny"])
    toggles = {c.label: c for c in _components(demo) if isinstance(c, gr.Checkbox) and c.interactive}
    assert toggles["CuTe GEMV"].value and toggles["CUDA graphs"].value and not toggles["Fast ops"].value
    assert not toggles["CuTe scan"].value  # off unless asked for
    fns = demo.fns.values() if isinstance(demo.fns, dict) else demo.fns
    (switch, *_) = [f for f in fns if toggles["CuTe GEMV"] in f.inputs and f.api_name != "synthesize"]
    status = switch.fn("tiny", False, True, True, True)
    assert calls == [("tiny", {"use_cute_gemv": False, "use_cute_scan": True, "cuda_graphs": True, "fast_ops": True})]
    assert "use_cute_scan, cuda_graphs, fast_ops" in status and not gi._generation_lock.locked()


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        gi.parse_args(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--model",
        "--codec",
        "--device",
        "--port",
        "--host",
        "--chunk-frames",
        "--cute-gemv",
        "--no-cuda-graphs",
        "--no-fast-ops",
    ):
        assert flag in out
    args = gi.parse_args(["--model", "./a", "--model", "b/c", "--port", "8000"])
    assert args.model == ["./a", "b/c"] and args.port == 8000 and args.host == "127.0.0.1"
    assert gi.parse_args([]).model == list(gi.DEFAULT_MODELS)
    with pytest.raises(SystemExit):
        gi.parse_args(["--port", "0"])


def test_model_cache_and_main(model, tmp_path, monkeypatch, capsys):
    """ModelCache loads a local directory once, swaps models on demand; main() preloads and serves."""
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

    import uvicorn

    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(kw, app=app))
    assert gi.main(["--model", str(a), "--device", "cpu", "--port", "7999", "--codec", "x/y"]) == 0
    assert served["host"] == "127.0.0.1" and served["port"] == 7999
    assert any(getattr(r, "path", None) == "/zonos/stream" for r in served["app"].routes)
    # An accelerator the CPU cannot run, or a missing model, is refused at load with one line.
    assert gi.main(["--model", str(a), "--device", "cpu", "--cute-gemv"]) == 2
    assert gi.main(["--model", str(tmp_path / "missing"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "use_cute_gemv=True needs" in err[0] and "missing" in err[1]


def test_model_cache_applies_accelerators_and_warms_up(model, tmp_path, monkeypatch, capsys):
    from zonos.codec import DACAutoencoder as PublicDAC

    monkeypatch.setattr(PublicDAC, "from_pretrained", staticmethod(lambda name, device: model.autoencoder))
    calls = []
    monkeypatch.setattr(gi.Zonos, "warmup", lambda self, **kw: calls.append(("warmup", kw)) or 1.5)
    monkeypatch.setattr(gi.Zonos, "use_accelerators", lambda self, **kw: calls.append(("accel", kw)))
    save_tiny_checkpoint(tmp_path, "hybrid")
    cache = gi.ModelCache(
        device="cpu", warmup=True, first_chunk_frames=3, chunk_frames=5, accelerators={"cuda_graphs": False}
    )
    cache(str(tmp_path))
    assert calls[-2:] == [
        ("accel", {"cuda_graphs": False}),
        (
            "warmup",
            {
                "all_prefill_lengths": True,
                "sampling_params": gi.SynthesisRequest().sampling_params(),
                "first_chunk_frames": 3,
                "chunk_frames": 5,
            },
        ),
    ]
    cache.set_accelerators(str(tmp_path), fast_ops=False)
    assert calls[-1] == ("accel", {"fast_ops": False})
    assert cache.accelerators == {"cuda_graphs": False, "fast_ops": False}
    assert "warmed up" in capsys.readouterr().out
    assert gi.parse_args(["--no-warmup"]).no_warmup


@pytest.mark.parametrize("device", ["mps", "nonsense", "cuda:9"])
def test_an_unusable_device_is_one_line(device, capsys):
    with pytest.raises(SystemExit) as exit_:
        gi.main(["--device", device, "--no-preload"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--device" in err and "Traceback" not in err
