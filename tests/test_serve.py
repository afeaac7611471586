"""The speech server through a real HTTP client on loopback: uvicorn in a thread on a free port, httpx (and the
openai package when installed) as clients, a tiny random model behind it."""

from __future__ import annotations

import base64
import io
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
sf = pytest.importorskip("soundfile")

from tiny import tiny_model  # noqa: E402

from zonos.conditioning import make_cond_dict  # noqa: E402
from zonos.serve import ServerSettings, create_app  # noqa: E402
from zonos.serve.encode import StreamingResampler, available_formats  # noqa: E402

# A streamed MP3 decodes to its samples plus LAME's encoder delay (576 + 529 samples) and the last frame's padding:
# under 4 frames of 1152 samples.
MP3_SLACK = 4 * 1152
FRAMES = 24  # per request: enough for a first chunk and two more at the schedule below
SCHEDULE = dict(first_chunk_frames=1, chunk_frames=4)
KEY = "test-key-123"
TEXT = "Hello there, this is a test."


class Server:
    """uvicorn serving ``app`` on 127.0.0.1 at a free port, in a thread."""

    def __init__(self, app):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("serve-model"))


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    voices = tmp_path_factory.mktemp("voices")
    settings = ServerSettings(
        api_key=KEY,
        voices_dir=voices,
        rate_limit=None,
        slots=4,
        queue_size=64,
        max_new_tokens=FRAMES,
        max_upload_bytes=200_000,
        max_body_bytes=16_000,
    )
    srv = Server(create_app(lambda: model, settings))
    srv.voices, srv.settings = voices, settings
    yield srv
    srv.stop()


def client(server, key=KEY, **kw) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=120, **kw)


def expected(model, text=TEXT, seed=0, speaking_rate=15.0, frames=FRAMES, speaker=None) -> np.ndarray:
    """What the server must stream: model.generate's streamed audio with the same seed and schedule."""
    with torch.inference_mode():
        prefix = model.prepare_conditioning(make_cond_dict(text=text, speaking_rate=speaking_rate, speaker=speaker))
    chunks = model.generate(
        prefix,
        max_new_tokens=frames,
        generator=torch.Generator().manual_seed(seed),
        stream=True,
        progress_bar=False,
        **SCHEDULE,
    )
    return torch.cat([c.audio for c in chunks], -1)[0, 0].numpy()


def native(text=TEXT, seed=0, fmt="pcm", **extra) -> dict:
    return dict(input=text, seed=seed, response_format=fmt, **SCHEDULE, **extra)


def pcm16(audio: np.ndarray, container: str = "WAV") -> np.ndarray:
    """libsndfile's 16-bit conversion of float audio: what a 16-bit file of it in ``container`` holds (its FLAC
    writer rounds differently from its WAV writer)."""
    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1, 1), 44100, "PCM_16", format=container)
    buf.seek(0)
    return sf.read(buf, dtype="int16")[0]


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Every int16 sample of a streamed file (read until libsndfile has no more: a stream's header has no length)."""
    f = sf.SoundFile(io.BytesIO(data))
    out, ffi = [], sf._ffi
    while True:
        buf = np.empty(4096, "int16")
        n = sf._snd.sf_readf_short(f._file, ffi.cast("short*", ffi.from_buffer(buf)), 4096)
        if n <= 0:
            break
        out.append(buf[:n])
    return np.concatenate(out), f.samplerate


def best_correlation(decoded: np.ndarray, reference: np.ndarray, max_lag: int) -> float:
    """The highest correlation of ``reference`` with ``decoded`` delayed by 0..max_lag samples (codec delay)."""
    smooth = np.ones(16) / 16  # below ~2.7 kHz, where lossy codecs keep the waveform
    decoded = np.convolve(decoded.astype(np.float64), smooth, "same")
    reference = np.convolve(reference.astype(np.float64), smooth, "same")
    n = min(len(reference), len(decoded) - max_lag)
    return max(np.corrcoef(decoded[lag : lag + n], reference[:n])[0, 1] for lag in range(max_lag + 1))


# ------------------------------------------------------------------------------------------ formats


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac", "mp3", "opus"])
def test_every_format_decodes_to_the_expected_samples(server, model, fmt):
    if fmt not in available_formats():
        pytest.skip(f"libsndfile here cannot encode {fmt}")
    want = expected(model, seed=3)
    assert np.abs(want).max() > 0.01  # a real signal, not silence
    with client(server) as c:
        r = c.post("/v1/zonos/speech", json=native(seed=3, fmt=fmt))
    assert r.status_code == 200, r.text
    assert r.headers["x-zonos-seed"] == "3"
    if fmt == "pcm":
        got = np.frombuffer(r.content, "<i2")
        np.testing.assert_array_equal(got, pcm16(want))
    elif fmt in ("wav", "flac"):
        got, sr = decode(r.content)
        assert sr == 44100
        np.testing.assert_array_equal(got, pcm16(want, fmt.upper()))
    elif fmt == "mp3":
        got, sr = decode(r.content)
        # A stream's Info frame (filled in at close) has gone out empty, so the decoder sizes the constant-rate
        # stream by its bytes: every sample comes back, plus the codec's delay and padding.
        assert sr == 44100 and len(want) <= len(got) <= len(want) + MP3_SLACK
        assert best_correlation(got, pcm16(want)[: len(got) - 3000], 3000) > 0.8
    else:
        got, sr = decode(r.content)
        r48 = StreamingResampler(44100, 48000)
        ref = np.concatenate([r48.push(want), r48.flush()])
        assert sr == 48000 and abs(len(got) - len(ref)) < 48000 * 0.05
        # Opus codes the tiny codec's noise-like audio by band energy, not waveform (the tone test below checks the
        # waveform path); here: a 48 kHz stream of the right length.


@pytest.mark.parametrize("fmt", ["mp3", "opus"])
def test_lossy_stream_keeps_a_tone(fmt):
    """A 440 Hz tone fed in uneven chunks comes back as the tone (at 48 kHz for opus)."""
    from zonos.serve.encode import StreamEncoder

    if fmt not in available_formats():
        pytest.skip(f"libsndfile here cannot encode {fmt}")
    x = (0.5 * np.sin(2 * np.pi * 440 * np.arange(30000) / 44100)).astype(np.float32)
    encoder = StreamEncoder(fmt)
    data = b"".join([encoder.encode(x[:875]), encoder.encode(x[875:5000]), encoder.encode(x[5000:]), encoder.finish()])
    got, sr = decode(data)
    if fmt == "opus":
        r48 = StreamingResampler(44100, 48000)
        x = np.concatenate([r48.push(x), r48.flush()])
    assert sr == (48000 if fmt == "opus" else 44100)
    assert best_correlation(got, x[: len(x) - 3000], 3000) > 0.99
    if fmt == "mp3":  # a constant 128 kbit/s: the stream's length follows from its size (it was 72% when variable)
        assert len(x) <= len(got) <= len(x) + MP3_SLACK
        assert abs(len(data) * 8 / (len(got) / 44100) - 128_000) < 128_000 * 0.02  # bits per decoded second


def test_streaming_resampler_equals_one_shot():
    from zonos.audio import resample

    x = np.random.default_rng(0).standard_normal(20011).astype(np.float32)
    want = resample(torch.from_numpy(x), 44100, 48000).numpy()
    for cuts in ([20011], [1, 4, 875, 1899, 3947, 8043, 20011], [300, 301, 20011]):
        r = StreamingResampler(44100, 48000)
        parts, start = [], 0
        for end in cuts:
            parts.append(r.push(x[start:end]))
            start = end
        got = np.concatenate([*parts, r.flush()])
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_openai_request_streams_the_seeded_audio_in_chunks(server, model):
    """The OpenAI route maps speed to the speaking rate; a seed header says how to reproduce it."""
    with (
        client(server) as c,
        c.stream(
            "POST",
            "/v1/audio/speech",
            json=dict(model="tts-1", input=TEXT, voice="alloy", response_format="pcm", speed=2),
        ) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("audio/pcm")
        pieces = [p for p in r.iter_raw() if p]
        seed = int(r.headers["x-zonos-seed"])
    assert len(pieces) >= 2  # chunks, not one body at the end
    with torch.inference_mode():
        prefix = model.prepare_conditioning(make_cond_dict(text=TEXT, speaking_rate=30.0))
    chunks = model.generate(
        prefix, max_new_tokens=FRAMES, generator=torch.Generator().manual_seed(seed), stream=True, progress_bar=False
    )
    want = torch.cat([ch.audio for ch in chunks], -1)[0, 0].numpy()
    np.testing.assert_array_equal(np.frombuffer(b"".join(pieces), "<i2"), pcm16(want))


def test_sse_stream_carries_the_same_audio(server, model):
    with client(server) as c:
        r = c.post("/v1/zonos/speech", json=native(seed=5, stream_format="sse"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] > 0
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    np.testing.assert_array_equal(np.frombuffer(audio, "<i2"), pcm16(expected(model, seed=5)))


def test_openai_package_streaming_call(server, model):
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    with oa.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="wav"
    ) as response:
        data = b"".join(response.iter_bytes(4096))
        seed = int(response.headers["x-zonos-seed"])
    got, sr = decode(data)
    with torch.inference_mode():
        prefix = model.prepare_conditioning(make_cond_dict(text=TEXT))
    chunks = model.generate(
        prefix, max_new_tokens=FRAMES, generator=torch.Generator().manual_seed(seed), stream=True, progress_bar=False
    )
    want = torch.cat([ch.audio for ch in chunks], -1)[0, 0].numpy()
    assert sr == 44100
    np.testing.assert_array_equal(got, pcm16(want))


def test_long_text_streams_whole(server, model):
    """Text over the segment budget is split at sentences and streams as one response: zonos.longform's one
    utterance, drawing from the request's seeded generator."""
    from zonos.longform import speak_segments

    text = "The first sentence is here. A second one follows it."
    segments = ["The first sentence is here.", "A second one follows it."]
    server.settings.segment_chars = 30
    try:
        with client(server) as c:
            r = c.post("/v1/zonos/speech", json=native(text=text, seed=8))
    finally:
        server.settings.segment_chars = 200
    assert r.status_code == 200, r.text
    chunks = speak_segments(
        model,
        segments,
        cond={},
        stream=True,
        max_new_tokens=FRAMES,
        generator=torch.Generator().manual_seed(8),
        progress_bar=False,
        **SCHEDULE,
    )
    want = torch.cat([ch.audio for ch in chunks], -1)[0, 0].numpy()
    got = np.frombuffer(r.content, "<i2")
    assert len(got) > len(pcm16(expected(model, text=segments[0], seed=8)))  # more than the first segment
    np.testing.assert_array_equal(got, pcm16(want))


def test_long_text_continues_the_prefix_audio(server, model):
    """A long text with prefix audio: the clip's codes lead the first segment and the rest follow it, as
    speak_segments(audio_prefix_codes=...) speaks them from the same seed."""
    from zonos.audio import MAX_PREFIX_SECONDS
    from zonos.longform import speak_segments
    from zonos.serve.service import read_clip

    sr = 44_100
    t = np.arange(int(0.2 * sr)) / sr
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t) * np.linspace(0.2, 1, t.size)).astype(np.float32), sr,
             format="WAV", subtype="PCM_16")  # fmt: skip
    clip = buf.getvalue()
    wav, rate = read_clip(clip, "prefix_audio", MAX_PREFIX_SECONDS)
    with torch.inference_mode():
        codes = model.autoencoder.encode(model.autoencoder.preprocess(wav.mean(0, keepdim=True)[None], rate))
    text = "The first sentence is here. A second one follows it."
    server.settings.segment_chars = 30
    try:
        with client(server) as c:
            body = native(text=text, seed=5, prefix_audio=base64.b64encode(clip).decode())
            r = c.post("/v1/zonos/speech", json=body)
    finally:
        server.settings.segment_chars = 200
    assert r.status_code == 200, r.text
    chunks = speak_segments(
        model,
        ["The first sentence is here.", "A second one follows it."],
        cond={},
        stream=True,
        audio_prefix_codes=codes,
        max_new_tokens=FRAMES,
        generator=torch.Generator().manual_seed(5),
        progress_bar=False,
        **SCHEDULE,
    )
    want = torch.cat([ch.audio for ch in chunks], -1)[0, 0].numpy()
    np.testing.assert_array_equal(np.frombuffer(r.content, "<i2"), pcm16(want))


# ---------------------------------------------------------------------------------- concurrency


def test_concurrent_requests_show_no_cross_talk(server, model):
    """Four requests at once, different texts and seeds: each equals its solo result to the last bit of its
    16-bit samples (the streams share the vocoder slab, whose float32 convs over 4 rows round unlike those over
    one; test_engine asserts batched = solo exactly in float64)."""
    jobs = [(f"Sentence number {i} is spoken here.", 10 + i) for i in range(4)]
    solo = [pcm16(expected(model, text=t, seed=s)) for t, s in jobs]

    def fetch(job):
        with client(server) as c:
            r = c.post("/v1/zonos/speech", json=native(text=job[0], seed=job[1]))
            assert r.status_code == 200, r.text
            return np.frombuffer(r.content, "<i2")

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(fetch, jobs))
    assert model.engine.steps > 0
    for g, want in zip(got, solo):
        assert g.shape == want.shape
        assert int(np.abs(g.astype(np.int32) - want).max()) <= 1


def test_a_request_cannot_raise_the_servers_frame_cap(server):
    with client(server) as c:
        r = c.post("/v1/zonos/speech", json=native(seed=1, max_new_tokens=10 * FRAMES))
    assert r.status_code == 200 and len(r.content) // 2 <= 512 * FRAMES  # pcm16: FRAMES frames of 512 samples


def test_disconnect_mid_stream_frees_the_slot(server, model):
    body = native(seed=1, max_new_tokens=200)  # long enough to be running when the client leaves
    server.settings.max_new_tokens = 200  # the server's cap, read per request
    try:
        with client(server) as c, c.stream("POST", "/v1/zonos/speech", json=body) as r:
            assert r.status_code == 200
            pieces = r.iter_raw()
            next(pieces)
            time.sleep(0.3)
            assert model.engine.active == 1  # still running: the client has read one piece and waits
    finally:
        server.settings.max_new_tokens = FRAMES
    deadline = time.time() + 20
    while model.engine.active and time.time() < deadline:
        time.sleep(0.02)
    assert model.engine.active == 0 and model.engine.queued == 0
    with client(server) as c:
        assert c.get("/health").json()["active"] == 0
        assert c.post("/v1/zonos/speech", json=native(seed=2)).status_code == 200  # the server still serves


def test_disconnect_while_a_whole_file_is_made_frees_the_slot(server, model):
    """stream false sends nothing until the audio is made; a client that gives up before then cancels it."""
    server.settings.max_new_tokens = 200
    steps = model.engine.steps
    try:
        with client(server) as c, pytest.raises(httpx.ReadTimeout):
            c.post("/v1/zonos/speech", json=native(seed=1, max_new_tokens=200, stream=False), timeout=0.25)
        deadline = time.time() + 20
        while model.engine.active and time.time() < deadline:
            time.sleep(0.02)
    finally:
        server.settings.max_new_tokens = FRAMES
    assert model.engine.active == 0 and model.engine.queued == 0
    # Cut short: the whole request takes 207 steps (200 frames, 9 for the delay pattern), ~1.6 s on 2 busy cores.
    assert model.engine.steps - steps < 200


def test_bounded_load_loses_nothing(server, model):
    """50 requests, 8 at a time, on 4 slots: every one answered in full."""
    full = len(pcm16(expected(model, text="Load.", seed=0)))

    def fetch(i):
        with client(server) as c:
            r = c.post("/v1/zonos/speech", json=native(text="Load.", seed=0))
            return r.status_code, len(r.content) // 2

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(fetch, range(50)))
    assert results == [(200, full)] * 50
    with client(server) as c:
        assert c.get("/health").json()["status"] == "ok"
        metrics = c.get("/metrics").text
    assert "zonos_ttfa_seconds_bucket" in metrics and "zonos_engine_steps_total" in metrics
    count = next(line for line in metrics.splitlines() if line.startswith("zonos_ttfa_seconds_count"))
    assert int(count.split()[1]) >= 50


# -------------------------------------------------------------------------------------- voices


def test_stored_voice_round_trip(server, model):
    from test_speaker import TINY, random_lda, random_state

    from zonos.speaker import SpeakerEmbedding

    model.spk_clone_model = SpeakerEmbedding.from_state_dicts(random_state(TINY), random_lda(TINY), config=TINY)
    t = np.arange(int(1.5 * 16000)) / 16000
    clip = (0.3 * np.sin(2 * np.pi * 180 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)
    wav = io.BytesIO()
    sf.write(wav, clip, 16000, format="WAV", subtype="FLOAT")
    with client(server) as c:
        r = c.post("/v1/audio/voices", data={"name": "tester"}, files={"file": ("clip.wav", wav.getvalue())})
        assert r.status_code == 200, r.text
        names = [v["name"] for v in c.get("/v1/audio/voices").json()["data"]]
        assert "tester" in names and "default" in names
        r = c.post("/v1/zonos/speech", json=native(seed=4, voice="tester"))
    assert r.status_code == 200
    with torch.inference_mode():
        speaker = model.make_speaker_embedding(torch.from_numpy(clip), 16000)
    np.testing.assert_array_equal(np.frombuffer(r.content, "<i2"), pcm16(expected(model, seed=4, speaker=speaker)))
    assert not np.array_equal(np.frombuffer(r.content, "<i2"), pcm16(expected(model, seed=4)))


# --------------------------------------------------------------------------------------- errors


def _error(r, status, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def test_clear_4xx_answers(server):
    with client(server) as c:
        speech = "/v1/audio/speech"
        _error(c.post(speech, json=dict(model="tts-1", input="  ", voice="alloy")), 400, "empty_input")
        _error(c.post(speech, json=dict(model="tts-1", input="a" * 4097, voice="alloy")), 400, "input_too_long")
        _error(c.post(speech, json=dict(model="tts-1", input=TEXT, voice="nobody-here")), 400, "unknown_voice")
        _error(c.post(speech, json=dict(model="tts-1", input=TEXT, response_format="aiff")), 400, "bad_response_format")
        _error(c.post(speech, json=dict(model="tts-1", input=TEXT, speed=9)), 400, "invalid_value")
        malformed = c.post(speech, content=b'{"input": "hi",', headers={"content-type": "application/json"})
        _error(malformed, 400, "bad_json")
        _error(c.post("/v1/zonos/speech", json=dict(input=TEXT, sampling={"min_p": 2.0})), 400)
        _error(c.post("/v1/zonos/speech", json=dict(input=TEXT, pitch_sdt=3)), 400, "invalid_value")  # misspelt
        big = {"name": "huge"}, {"file": ("big.wav", b"\0" * 300_000)}
        _error(c.post("/v1/audio/voices", data=big[0], files=big[1]), 413, "too_large")
        not_audio = c.post("/v1/audio/voices", data={"name": "x"}, files={"file": ("a.wav", b"not audio")})
        _error(not_audio, 400, "bad_audio")
        _error(c.post(speech, json=dict(input="a" * 20_000)), 413, "too_large")
        chunked = c.post(speech, content=iter([b" " * 10_000] * 3), headers={"content-type": "application/json"})
        _error(chunked, 413, "too_large")  # no Content-Length: counted as it arrives
    for key in (None, "wrong-key"):
        with client(server, key=key) as c:
            _error(c.post("/v1/audio/speech", json=dict(input=TEXT)), 401, "invalid_api_key")
            assert c.get("/health").status_code == 200  # health needs no key


def test_full_queue_is_503_with_retry_after(model):
    settings = ServerSettings(rate_limit=None, slots=None, max_new_tokens=250)
    model.start_engine(slots=1, queue_size=1)
    srv = Server(create_app(lambda: model, settings))
    try:
        long = native(seed=1, max_new_tokens=250)
        with client(srv, key=None) as c, c.stream("POST", "/v1/zonos/speech", json=long) as r:
            assert r.status_code == 200
            pieces = r.iter_raw()  # kept: a dropped iterator closes the stream
            next(pieces)  # the one slot is taken
            short = native(max_new_tokens=FRAMES)
            with client(srv, key=None) as c2, c2.stream("POST", "/v1/zonos/speech", json=short) as queued:
                assert queued.status_code == 200 and (model.engine.active, model.engine.queued) == (1, 1)
                with client(srv, key=None) as c3:
                    busy = c3.post("/v1/zonos/speech", json=short)
                _error(busy, 503, "engine_full")
                assert int(busy.headers["retry-after"]) >= 1
    finally:
        srv.stop()
        model.start_engine(slots=4, queue_size=64)


def test_long_text_into_a_full_engine_is_503_before_the_answer(model):
    """A long text's first segment is submitted before the 200: a full engine answers it 503 at once."""
    settings = ServerSettings(rate_limit=None, slots=None, max_new_tokens=250, segment_chars=30)
    model.start_engine(slots=1, queue_size=1)
    srv = Server(create_app(lambda: model, settings))
    try:
        with client(srv, key=None) as c, c.stream("POST", "/v1/zonos/speech", json=native(seed=1)) as r:
            assert r.status_code == 200
            pieces = r.iter_raw()  # kept: a dropped iterator closes the stream
            next(pieces)  # the one slot is taken
            with client(srv, key=None) as c2, c2.stream("POST", "/v1/zonos/speech", json=native()) as queued:
                assert queued.status_code == 200 and (model.engine.active, model.engine.queued) == (1, 1)
                with client(srv, key=None) as c3:
                    long = native(text="The first sentence is here. A second one follows it.")
                    busy = c3.post("/v1/zonos/speech", json=long)
                _error(busy, 503, "engine_full")
    finally:
        srv.stop()
        model.start_engine(slots=4, queue_size=64)


def test_rate_limit_per_key(model):
    srv = Server(create_app(lambda: model, ServerSettings(rate_limit=2, slots=None, max_new_tokens=FRAMES)))
    try:
        with client(srv, key=None) as c:
            codes = [c.get("/v1/audio/voices").status_code for _ in range(3)]
            assert codes == [200, 200, 429]
            r = c.get("/v1/audio/voices")
            _error(r, 429, "rate_limited")
            assert int(r.headers["retry-after"]) >= 1
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------ Ray Serve


def test_ray_serve_two_replicas_stream(model, tmp_path):
    """A local Ray with two CPU replicas of the tiny model: streamed requests spread over both, each exact."""
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    from tiny import save_tiny_checkpoint, tiny_codec

    from zonos.serve.ray_app import ModelLoader, deployment

    (tmp_path / "model").mkdir()
    save_tiny_checkpoint(tmp_path / "model", "hybrid")
    tiny_codec().save_pretrained(tmp_path / "codec")
    loader = ModelLoader(str(tmp_path / "model"), str(tmp_path / "codec"), device="cpu", max_seqlen=256)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        settings = ServerSettings(rate_limit=None, slots=2, queue_size=8, max_new_tokens=FRAMES)
        serve.run(deployment(loader, settings, num_replicas=2, gpus_per_replica=0), route_prefix="/")
        jobs = [(f"Replica test {i}.", 20 + i) for i in range(6)]

        def fetch(job):
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as c:
                r = c.post("/v1/zonos/speech", json=native(text=job[0], seed=job[1]))
                assert r.status_code == 200, r.text
                return np.frombuffer(r.content, "<i2"), r.headers["x-zonos-instance"]

        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(fetch, jobs))
        assert len({instance for _, instance in got}) == 2
        for (audio, _), (text, seed) in zip(got, jobs):  # to 1 LSB: the replica's streams share its vocoder slab
            want = pcm16(expected(model, text=text, seed=seed))
            assert audio.shape == want.shape
            assert int(np.abs(audio.astype(np.int32) - want).max()) <= 1
    finally:
        serve.shutdown()
        ray.shutdown()


def test_serve_command_loads_before_serving_and_refuses_bad_input_in_one_line(tmp_path, monkeypatch, capsys):
    """zonos-tts serve loads the model (and checks the slots fit) before uvicorn starts: a truncated checkpoint or
    a bad flag is one error line and status 2, where a load failing inside the server's startup was a traceback."""
    from tests.tiny import save_tiny_checkpoint, tiny_codec
    from zonos import cli

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append((app, kw)))
    (tmp_path / "model").mkdir()
    save_tiny_checkpoint(tmp_path / "model", "hybrid")
    tiny_codec().save_pretrained(tmp_path / "codec")
    common = ["--model", str(tmp_path / "model"), "--codec", str(tmp_path / "codec"), "--device", "cpu"]
    assert cli.main(["serve", *common, "--no-warmup", "--port", "8123"]) == 0
    assert served and served[0][1]["host"] == "127.0.0.1" and served[0][1]["port"] == 8123  # localhost by default
    capsys.readouterr()
    weights = tmp_path / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    for argv, message in [
        (common, "model.safetensors"),
        ([*common, "--queue-size", "0"], "--queue-size must be positive"),
        ([*common, "--max-seqlen", "3"], "--max-seqlen must be at least 16"),
        ([*common[:-1], "mps"], "'mps' is not available"),
    ]:
        assert cli.main(["serve", *argv]) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[-1].startswith("error: ") and message in lines[-1] and "Traceback" not in "".join(lines), lines
    assert len(served) == 1


def test_long_text_is_checked_whole_before_the_answer_starts(server):
    """A text of several segments is conditioned segment by segment as the stream goes; every segment's inputs are
    checked before the 200, so a bad one is a 400 (it was an empty 200)."""
    long = "The first sentence is here. A second one follows it."
    server.settings.segment_chars = 30
    try:
        with client(server) as c:
            assert c.post("/v1/zonos/speech", json=native(text=long)).status_code == 200
            _error(c.post("/v1/zonos/speech", json=native(text=long, language="xx")), 400)
            _error(c.post("/v1/zonos/speech", json=native(text=long, emotion=[1.0, 2.0])), 400)
            _error(c.post("/v1/zonos/speech", json=native(text=long + " <>. <>.")), 400)
            server.settings.segment_chars = 200  # two 200-character segments do not fit the tiny model's slots
            err = _error(c.post("/v1/zonos/speech", json=native(text="Hello there my friend. " * 18)), 400)
            # zonos.longform's arithmetic, and the fixes open to this server's client and to its operator
            taken = r"segment 2 of 3: its text and the previous segment's take \d+ of the model's 256 positions"
            assert re.search(taken, err["message"]), err
            assert "at most 200 characters" in err["message"] and "--max-seqlen" in err["message"], err
    finally:
        server.settings.segment_chars = 200


def test_long_text_gets_the_clis_segment_budgets(tmp_path, monkeypatch):
    """The server and ``zonos-tts speak`` give the same text the same frame budget per segment: zonos.longform's,
    each segment what the slots leave beside the previous segment's audio. With 200 positions a segment's default
    2580 frames would not fit, and the tiny model never ends a segment itself, so each takes its whole budget."""
    from tiny import tiny_codec

    from zonos import cli
    from zonos.cli import speak as speak_command
    from zonos.conditioning.segments import split_text
    from zonos.longform import prefix_lengths

    text = "The first sentence is here. A second one follows, with a comma in it. And a third closes the text."
    (tmp_path / "model").mkdir()
    model = tiny_model(tmp_path / "model")  # also the checkpoint the CLI is pointed at
    tiny_codec().save_pretrained(tmp_path / "codec")
    budgets = []
    submit = model.submit

    def record(*args, **kwargs):
        budgets.append(kwargs["max_new_tokens"])
        return submit(*args, **kwargs)

    monkeypatch.setattr(model, "submit", record)
    monkeypatch.setattr(speak_command, "load_model", lambda args, device: model)
    settings = ServerSettings(rate_limit=None, slots=2, queue_size=4, max_seqlen=200, segment_chars=45, warmup=False)
    srv = Server(create_app(lambda: model, settings))
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            r = c.post("/v1/zonos/speech", json=native(text=text))
        assert r.status_code == 200, r.text
        served, budgets[:] = list(budgets), []
        argv = ["speak", text, "--model", str(tmp_path / "model"), "--codec", str(tmp_path / "codec"),
                "--device", "cpu", "--no-progress", "--max-segment-chars", "45", "--stream",
                "--out", str(tmp_path / "long.wav")]  # fmt: skip
        assert cli.main(argv) == 0
    finally:
        srv.stop()
    lengths = prefix_lengths(model, split_text(text, 45))
    expected, previous = [], 0
    for k, length in enumerate(lengths):
        room = 200 - 9 - length - previous
        previous = min(room, (200 - 9 - lengths[k + 1]) // 2) if k + 1 < len(lengths) else room
        expected.append(previous)
    assert len(expected) == 3 and all(0 < b < 2580 for b in expected)
    assert served == budgets == expected
    assert len(np.frombuffer(r.content, "<i2")) == 512 * sum(expected)


@pytest.mark.parametrize("bad", [dict(rate_limit=0), dict(rate_limit=float("nan")), dict(max_new_tokens=0),
                                 dict(queue_size=0), dict(segment_chars=True)])  # fmt: skip
def test_server_settings_are_checked(bad):
    from zonos.errors import ZonosInputError

    with pytest.raises(ZonosInputError, match=next(iter(bad))):
        ServerSettings(**bad)


# ------------------------------------------------------------------------------ bodies, files, errors


def readme_curl() -> str:
    """The curl command of README.md's "Speech server" section, its continuation lines joined."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Speech server", 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in section.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("curl "))
    command = []
    for line in lines[start:]:
        command.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            break
    return " ".join(command)


def test_readme_curl_example_writes_a_wav(server, tmp_path):
    """README's curl example, run as written against the server: a WAV file of speech; with a wrong key, curl
    fails and writes no file (the JSON error went into hello.wav without --fail)."""
    import os
    import shutil
    import subprocess

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    command = readme_curl()
    assert "http://127.0.0.1:8000" in command and "hello.wav" in command, command
    command = command.replace("http://127.0.0.1:8000", server.url)
    for key, ok in ((KEY, True), ("wrong-key", False)):
        out = tmp_path / "hello.wav"
        out.unlink(missing_ok=True)
        run = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=dict(os.environ, KEY=key),
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        if not ok:
            assert run.returncode == 22 and not out.exists(), (run.returncode, run.stderr)
            continue
        assert run.returncode == 0, run.stderr
        audio, sr = sf.read(out, dtype="int16")
        assert sr == 44100 and len(audio) >= 512 and np.abs(audio).max() > 100


def test_json_body_is_read_whatever_its_content_type_says(server, model):
    """A JSON body sent as text/plain, as curl -d's form type or with no type is read as JSON; a body of another
    type, one that is not JSON and one that is not UTF-8 are refused, each with what to send."""
    body = json.dumps(native(seed=6)).encode()
    want = pcm16(expected(model, seed=6))
    with client(server) as c:
        for content_type in (None, "text/plain", "application/x-www-form-urlencoded", "application/json"):
            headers = {} if content_type is None else {"content-type": content_type}
            r = c.post("/v1/zonos/speech", content=body, headers=headers)
            assert r.status_code == 200, (content_type, r.text)
            np.testing.assert_array_equal(np.frombuffer(r.content, "<i2"), want)
        err = _error(c.post("/v1/zonos/speech", content=body, headers={"content-type": "application/xml"}), 415)
        assert err["code"] == "unsupported_media_type" and "application/json" in err["message"]
        err = _error(c.post("/v1/audio/speech", content=b"input=hello", headers={"content-type": "text/plain"}), 400)
        assert err["code"] == "bad_json" and "JSON object" in err["message"]
        latin1 = '{"input": "caf\u00e9 au lait"}'.encode("latin-1")
        err = _error(c.post("/v1/audio/speech", content=latin1, headers={"content-type": "application/json"}), 400)
        assert err["code"] == "bad_encoding" and "UTF-8" in err["message"]


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
def test_whole_file_answer_carries_its_length(server, model, fmt):
    """stream false: one complete file whose header gives its length, so soundfile.read takes it at once (a
    streamed flac's header says 'unknown', which soundfile.read refuses; reading to the end decodes it)."""
    if fmt not in available_formats():
        pytest.skip(f"libsndfile here cannot encode {fmt}")
    want = expected(model, seed=7)
    with client(server) as c:
        whole = c.post("/v1/zonos/speech", json=native(seed=7, fmt=fmt, stream=False))
        streamed = c.post("/v1/zonos/speech", json=native(seed=7, fmt=fmt))
    assert whole.status_code == 200 and streamed.status_code == 200, whole.text
    assert int(whole.headers["content-length"]) == len(whole.content)
    got, sr = sf.read(io.BytesIO(whole.content), dtype="int16")
    if fmt == "opus":
        r48 = StreamingResampler(44100, 48000)
        assert sr == 48000 and len(got) == len(np.concatenate([r48.push(want), r48.flush()]))
    else:
        assert sr == 44100 and len(got) == len(want)  # mp3 too: the Info frame gives its delay and padding
    if fmt in ("wav", "flac"):
        np.testing.assert_array_equal(got, pcm16(want, fmt.upper()))
        np.testing.assert_array_equal(decode(streamed.content)[0], got)  # the stream: the same samples
    if fmt == "flac":
        assert sf.info(io.BytesIO(streamed.content)).frames != len(want)  # a stream's header cannot know it
    with client(server) as c:
        err = _error(c.post("/v1/zonos/speech", json=native(fmt=fmt, stream=False, stream_format="sse")), 400)
    assert err["param"] == "stream"


def test_every_error_is_openai_shaped(server, monkeypatch):
    """No route, a method the route lacks and a server failure answer OpenAI's error object, not FastAPI's
    {"detail": ...}."""
    from zonos.serve.service import SpeechService

    with client(server) as c:
        err = _error(c.get("/v1/nothing-here"), 404, "not_found")
        assert "/v1/audio/speech" in err["message"] and err["type"] == "invalid_request_error"
        r = c.get("/v1/audio/speech")
        err = _error(r, 405, "method_not_allowed")
        assert "POST" in err["message"] and r.headers["allow"] == "POST"
        _error(c.put("/v1/audio/voices"), 405, "method_not_allowed")

        def fail(self, spec):
            raise RuntimeError("a bug")

        monkeypatch.setattr(SpeechService, "check", fail)
        err = _error(c.post("/v1/audio/speech", json=dict(input=TEXT)), 500, "internal_error")
        assert err["type"] == "server_error" and "RuntimeError" in err["message"]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("dnsmos_ovrl", float("nan"), "finite"), ("vqscore_8", [0.7], "8 numbers"),
     ("vqscore_8", [float("nan")] * 8, "finite"), ("dnsmos_ovrl", float("inf"), "finite")],
)  # fmt: skip
def test_unconditional_quality_targets_are_still_checked(server, field, value, says):
    """vqscore_8 and dnsmos_ovrl are unconditional by default, so their values go unused; a NaN or a wrong length
    is still the client's mistake, refused by make_cond_dict's checks."""
    body = json.dumps(native(**{field: value})).encode()  # NaN and Infinity as Python writes them
    with client(server) as c:
        err = _error(c.post("/v1/zonos/speech", content=body, headers={"content-type": "application/json"}), 400)
    assert field in err["message"] and says in err["message"], err


def test_voice_upload_without_a_speaker_model_is_the_servers_503(server, model, monkeypatch):
    """The speaker model is loaded on first use; when its files cannot be had (offline, not cached) the upload
    fails for the server's reason, not the client's: a 503 saying what the operator must install."""
    from zonos.hub import CheckpointNotAvailableError
    from zonos.speaker import SpeakerEmbedding

    def offline(cls, *args, **kwargs):
        raise CheckpointNotAvailableError("could not get the speaker model's files from the Hub or its cache")

    monkeypatch.setattr(model, "spk_clone_model", None)
    monkeypatch.setattr(SpeakerEmbedding, "from_pretrained", classmethod(offline))
    t = np.arange(int(1.5 * 16000)) / 16000
    wav = io.BytesIO()
    sf.write(wav, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 16000, format="WAV")
    with client(server) as c:
        r = c.post("/v1/audio/voices", data={"name": "nomodel"}, files={"file": ("clip.wav", wav.getvalue())})
    err = _error(r, 503, "speaker_model_unavailable")
    assert err["type"] == "server_error" and "operator" in err["message"] and "hf download" in err["message"]
    assert not (server.voices / "nomodel.pt").exists()
