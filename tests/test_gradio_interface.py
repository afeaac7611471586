"""The web demo on a tiny random model, served for real (uvicorn on a free port): the stream route's PCM
concatenates to the one-shot decode of the same seed and sampler settings, a closed connection stops
generation and leaves the model ready, bad input answers with its message, prefix and speaker clips are
used, the Gradio API has named parameters and returns audio to gradio_client, and the page offers the
accelerator toggles only where they can run."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

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
from zonos.errors import ZonosInputError  # noqa: E402
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


@pytest.fixture(scope="module")
def server(model, uploads):
    """The demo served on the tiny model; ``server.loads`` records the model names asked for."""

    def load(name: str) -> Zonos:
        load.calls.append(name)
        return model

    load.calls = []
    app = gi.build_app(load, ["tiny"], device="cpu", **SCHEDULE)
    with serve(app) as url:
        yield type("Server", (), {"url": url, "loads": load.calls})


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


def _one_shot(model, audio_prefix_codes=None, speaker=None, **overrides) -> np.ndarray:
    s = {**dict(gi.SynthesisRequest().__dict__), **SETTINGS, **overrides}
    request = gi.SynthesisRequest.from_mapping(s)
    cond = make_cond_dict(
        text=s["text"],
        language="en-us",
        speaker=speaker,
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
    codes = model.generate(
        model.prepare_conditioning(cond),
        audio_prefix_codes=audio_prefix_codes,
        max_new_tokens=s["max_new_tokens"],
        cfg_scale=s["cfg_scale"],
        sampling_params={**sampling, "repetition_penalty": s["repetition_penalty"]},
        progress_bar=False,
        generator=torch.Generator().manual_seed(s["seed"]),
    )
    return model.autoencoder.decode(codes)[0, 0].numpy()


def _assert_same_audio(audio: np.ndarray, ref: np.ndarray) -> None:
    assert audio.dtype == np.float32 and audio.shape == ref.shape and np.abs(ref).max() > 1e-3
    noise = np.sum((audio.astype(np.float64) - ref) ** 2)
    assert 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(noise, 1e-30)) >= 90


def test_stream_equals_one_shot_and_reports_its_timing(model, server):
    events, audio = _stream(server)
    _assert_same_audio(audio, _one_shot(model))
    start, first, done = events
    assert start["event"] == "start" and start["seed"] == 11 and start["sample_rate"] == 44100
    assert start["device"] == "cpu" and start["prefix_frames"] == 0
    assert first["event"] == "first_audio" and 0 < first["generation_ms"] < first["ttfa_ms"]
    assert done["event"] == "done" and not done["stopped"] and done["samples"] == audio.size
    assert done["seconds"] == pytest.approx(audio.size / 44100) and done["rtf"] > 0
    assert abs(done["t_end_wall_ms"] - time.time() * 1000) < 30_000
    assert server.loads[-1] == "tiny"


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
    assert "not an uploaded clip" in _error(server, speaker_audio="/etc/hostname")
    assert "Unknown model 'other'" in _error(server, model_name="other")
    assert len(server.loads) == calls  # all checked before the model is asked for

    garbage = uploads / "voice.wav"
    garbage.write_bytes(b"not audio at all" * 64)
    assert "Could not read the speaker audio" in _error(server, speaker_audio=str(garbage))
    assert "Could not read the prefix audio" in _error(server, prefix_audio=str(garbage))
    assert "Could not read the speaker audio" in _error(server, speaker_audio=str(uploads / "missing.wav"))
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
    assert "max_seqlen" in _error(server, max_new_tokens=1000)  # the tiny model holds 256 positions
    assert "characters, more than one generation can speak" in _error(server, text="word " * 1000)
    resp = httpx.post(server.url + "zonos/stream", content=b"{" + b" " * gi.MAX_REQUEST_BYTES + b"}")
    assert resp.status_code == 413 and "over 65536 bytes" in resp.json()["error"]
    resp = httpx.post(server.url + "zonos/stream", content=b'{"seed": 1' + b"0" * 400 + b"}")
    assert resp.status_code == 400 and "seed must be a finite number" in resp.json()["error"]
    resp = httpx.post(server.url + "zonos/stream", content=b"{")
    assert resp.status_code == 400 and "property name" in resp.json()["error"]  # the JSON parser's message
    assert "JSON object" in httpx.post(server.url + "zonos/stream", json=[1]).json()["error"]


def test_busy_model_answers_503(server):
    assert gi._generation_lock.acquire(timeout=1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gi, "LOCK_TIMEOUT_S", 0.05)
            resp = _post(server)
    finally:
        gi._generation_lock.release()
    assert resp.status_code == 503 and "busy" in resp.json()["error"]


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


def test_page_serves_the_player(server):
    page = httpx.get(server.url).text
    assert "zonos/player.js" in page  # in the page's config: Gradio's frontend adds it to the head
    js = httpx.get(server.url + "zonos/player.js")
    assert js.headers["content-type"].startswith("text/javascript") and "window.zonosPlayer" in js.text


def test_gradio_client_gets_audio_from_named_parameters(model, server):
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
    with pytest.raises(Exception, match="The text is empty"):  # the message itself, not a generic error
        client.predict(text=" ", api_name="/synthesize")


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
