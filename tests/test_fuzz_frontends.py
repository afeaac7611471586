"""Seeded random cases through the front ends on tiny models: the command line, the web demo's request path and
the speech server. Each case either succeeds with audio that is finite and not silent, or answers with the
project's message: the CLI with one ``error:`` line and exit status 2, the demo with a ZonosInputError (whose
message the page shows), the server with a 4xx JSON error. A traceback, another exit status, a 5xx answer or a
case past its time limit fails the test. See tests/test_fuzz.py for the library's entry points.
"""

from __future__ import annotations

import base64
import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sf = pytest.importorskip("soundfile")

from tests.test_cli import TINY_SPEAKER, one_line_error, run  # noqa: E402
from tests.test_fuzz import CASE_SECONDS, INF, NAN, pick, run_case, time_limit  # noqa: E402
from tests.tiny import save_tiny_checkpoint, tiny_codec, tiny_model  # noqa: E402
from zonos.cli import speak  # noqa: E402
from zonos.cli.common import load_model  # noqa: E402
from zonos.speaker import SpeakerEmbedding  # noqa: E402
from zonos.speaker.voices import VOICE_FORMAT, save_voice  # noqa: E402

FRAMES = 6


def _tiny_speaker() -> SpeakerEmbedding:
    from tests.test_speaker import random_lda, random_state

    return SpeakerEmbedding.from_state_dicts(random_state(TINY_SPEAKER), random_lda(TINY_SPEAKER), config=TINY_SPEAKER)


def _speech_like(seconds: float, sr: int, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    noise = 0.05 * np.random.default_rng(seed).standard_normal(t.size)
    return (0.3 * np.sin(2 * np.pi * 170 * t) * np.sin(2 * np.pi * 3 * t) + noise).astype(np.float32)


def _write_long_flac(path: Path) -> None:
    with sf.SoundFile(path, "w", 8000, 1, "PCM_16", format="FLAC") as f:
        for _ in range(120):
            f.write(np.full(80_000, 0.1, np.float32))


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    """Good and bad clips and voice files, as a user might hand them over."""
    d = tmp_path_factory.mktemp("fuzz_clips")
    files = {
        "voice.wav": lambda p: sf.write(p, _speech_like(1.2, 24000), 24000),
        "stereo.flac": lambda p: sf.write(p, np.stack([_speech_like(1.0, 22050, 1)] * 2, 1), 22050),
        "short.wav": lambda p: sf.write(p, _speech_like(0.05, 16000), 16000),
        "silent.wav": lambda p: sf.write(p, np.zeros(24000, np.float32), 24000),
        "1hz.wav": lambda p: sf.write(p, _speech_like(2000, 1), 1),  # a 2 KB file claiming 1 Hz
        "loud.wav": lambda p: sf.write(p, _speech_like(1.0, 16000) * 32767, 16000, subtype="FLOAT"),
        "nan.wav": lambda p: sf.write(p, np.full(16000, np.nan, np.float32), 16000, subtype="FLOAT"),
        "garbage.wav": lambda p: p.write_bytes(b"not audio at all" * 64),
        "long.flac": _write_long_flac,  # 20 minutes in a few KB (a decode bomb)
        "empty.wav": lambda p: p.write_bytes(b""),
        "good.pt": lambda p: save_voice(p, torch.randn(128) * 0.1),
        "nan.pt": lambda p: torch.save(
            {"format": VOICE_FORMAT, "version": 1, "embedding": torch.full((128,), NAN)}, p
        ),  # fmt: skip
        "junk.pt": lambda p: p.write_bytes(b"\x00not a torch file"),
    }
    for name, write in files.items():
        write(d / name)
    return {name: d / name for name in files} | {"missing.wav": d / "missing.wav", "dir": d}


# -- the command line ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_cli")
    (root / "model").mkdir()
    save_tiny_checkpoint(root / "model", "transformer")
    tiny_codec().save_pretrained(root / "codec")
    common = ["--model", str(root / "model"), "--codec", str(root / "codec"), "--device", "cpu", "--no-progress"]
    args = speak.build_parser("t", "x.wav").parse_args(["x", *common])
    return load_model(args, torch.device("cpu")), common


def _flag_values(clips: dict[str, Path]) -> dict[str, list]:
    c = {k: str(v) for k, v in clips.items()}
    numbers = ["nan", "inf", "-inf", "-1", "0", "1e39", "x", ""]
    return {
        "--cfg-scale": [["2"], ["1.5"], *[[v] for v in numbers]],
        "--temperature": [["1"], ["0.7"], ["0"], *[[v] for v in numbers]],
        "--top-p": [["0.9"], ["0"], ["2"], ["nan"]],
        "--top-k": [["5"], ["0"], ["-1"], ["1.5"], ["nan"]],
        "--min-p": [["0.1"], ["0"], ["1.5"], ["nan"]],
        "--linear": [["0.5"], ["0"], ["nan"], ["-3"]],
        "--conf": [["0.4"], ["nan"]],
        "--quad": [["0"], ["inf"]],
        "--repetition-penalty": [["3"], ["1"], ["0"], ["nan"]],
        "--repetition-penalty-window": [["2"], ["0"], ["-1"], ["2.5"]],
        "--seed": [["1"], ["0"], ["-1"], [str(2**70)], ["x"]],
        "--max-new-tokens": [["4"], [str(FRAMES)], ["0"], ["-2"], ["100000"], ["x"]],
        "--language": [["en-us"], ["de"], ["xx"], ["ja"], [""]],
        "--emotion": [["0.3"] * 8, ["0"] * 8, ["-1"] + ["1"] * 7, ["nan"] * 8, ["3e38"] * 8, ["1", "2"]],
        "--pitch-std": [["45"], ["nan"], ["-1"], ["1000"]],
        "--speaking-rate": [["15"], ["0"], ["inf"], ["100"]],
        "--fmax": [["22050"], ["-5"], ["nan"]],
        "--unconditional": [["emotion"], ["speaker"], ["mood"]],
        "--stream": [[]],
        "--first-chunk-frames": [["1"], ["2"], ["0"]],
        "--chunk-frames": [["4"], ["0"], ["-3"]],
        "--sample-format": [["pcm16"], ["float"], ["double"]],
        "--voice": [[c["good.pt"]], [c["nan.pt"]], [c["junk.pt"]], [c["voice.wav"]], [c["missing.wav"]]],
        "--speaker-audio": [[c["voice.wav"]], [c["stereo.flac"]], [c["short.wav"]], [c["silent.wav"]], [c["long.flac"]],
                            [c["1hz.wav"]], [c["loud.wav"]], [c["nan.wav"]], [c["garbage.wav"]], [c["empty.wav"]]],
        "--speaker-embedding": [[c["voice.wav"]], [c["good.pt"]]],
        "--device": [["cpu"], ["mps"], ["nonsense"], ["cuda:9"]],
        "--cute-gemv": [[]],
        "--no-fused-sampling": [[]],
        "--max-segment-chars": [["300"], ["0"], ["5"]],
    }  # fmt: skip


TEXTS = ["Testing one, two.", "It is 3:15 on the 21st.", "1" * 40, "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
         "\u200b", "<>", "  ", "\ud800 lone", "Ünïcödé façade.", "Hi! " * 30]  # fmt: skip


def test_fuzz_command_line(cli_model, clips, tmp_path, monkeypatch, capsys):
    """Random ``speak`` argument lists: exit 0 with a readable, non-silent file, or exit 2 with one line."""
    model, common = cli_model
    monkeypatch.setattr(speak, "load_model", lambda args, device: model)
    speaker = _tiny_speaker()
    monkeypatch.setattr(SpeakerEmbedding, "from_pretrained", classmethod(lambda cls, *a, **k: speaker))
    values = _flag_values(clips)
    rng = random.Random(21)
    spoken = refused = 0
    for i in range(70):
        text = rng.choice(TEXTS[:2]) if rng.random() < 0.6 else rng.choice(TEXTS)
        out = tmp_path / f"case{i}{pick(rng, ['.wav', '.wav', '.flac', '.ogg', '.mp3'])}"
        argv = ["speak", text, *common, "--max-new-tokens", str(FRAMES), "--out", str(out)]
        for flag in rng.sample(sorted(values), rng.randint(0, 3)):
            options = values[flag]
            argv += [flag, *(options[0] if rng.random() < 0.4 else rng.choice(options))]
        label = f"case {i}: zonos-tts {' '.join(repr(a) if ' ' in a or not a else a for a in argv[:2] + argv[10:])}"
        with time_limit(CASE_SECONDS):
            code, _, err = run(argv, capsys)
        if code == 0:
            spoken += 1
            audio, sr = sf.read(out, dtype="float32")
            assert sr == 44100 and audio.size and np.isfinite(audio).all() and np.abs(audio).max() > 0, label
        else:
            refused += 1
            assert code == 2, f"{label}: exit status {code}: {err}"
            message = one_line_error(err)
            assert "Traceback" not in message and len(message) > len("error: ") + 10, label
            assert not out.exists(), f"{label}: a refused run left {out.name}"
    assert spoken >= 10 and refused >= 10


# -- the web demo ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory):
    model = tiny_model(tmp_path_factory.mktemp("fuzz_demo"))
    model.spk_clone_model = _tiny_speaker()
    return model


def _demo_values(uploads: dict[str, str]) -> dict[str, list]:
    numbers = [NAN, INF, -1.0, 0, 1e30, True, "2", None, [1.0]]
    return {
        "text": ["Hello, world!", "It is 3:15.", "", "  ", "\u200b", "<>", "\ud800", 5, None, "1" * 40],
        "language": ["en-us", "de", "English", "xx", "", None, 3],
        "model_name": [None, "tiny", "other", 5],
        "speaker_audio": [None, "", uploads["voice.wav"], uploads["stereo.flac"], uploads["1hz.wav"],
                          uploads["silent.wav"], uploads["garbage.wav"], uploads["missing.wav"], "/etc/hostname",
                          uploads["long.flac"],
                          {"path": uploads["voice.wav"]}, {"path": 5}, 7],
        "prefix_audio": [None, uploads["voice.wav"], uploads["short.wav"], uploads["nan.wav"], uploads["1hz.wav"],
                         uploads["empty.wav"], uploads["long.flac"]],
        "happiness": [0.6, 0.0, *numbers],
        "neutral": [0.3, 1.0, *numbers],
        "vq_score": [0.78, 0.5, *numbers],
        "fmax": [22050.0, 0.0, 1e9, *numbers],
        "pitch_std": [45.0, 400.0, 1000.0, *numbers],
        "speaking_rate": [15.0, 5.0, *numbers],
        "dnsmos_ovrl": [4.0, *numbers],
        "speaker_noised": [False, True, 1, "yes"],
        "unconditional_keys": [[], ["emotion"], ["speaker", "fmax"], ["mood"], "emotion", [1]],
        "cfg_scale": [2.0, 1.0, *numbers],
        "temperature": [1.0, 0.0, *numbers],
        "linear": [0.5, 0.0, *numbers],
        "conf": [0.4, *numbers],
        "quad": [0.0, *numbers],
        "top_p": [0.0, 0.9, 1.5, *numbers],
        "top_k": [0, 5, 1.5, *numbers],
        "min_p": [0.0, 0.1, *numbers],
        "repetition_penalty": [3.0, 1.0, *numbers],
        "seed": [420, 0, -1, 2**70, 1.5, *numbers],
        "randomize_seed": [False, True, 1],
        "max_new_tokens": [FRAMES, 4, 0, -1, 10**6, *numbers],
        "voice": ["x"],
    }  # fmt: skip


def test_fuzz_demo_requests(demo_model, clips, tmp_path_factory, monkeypatch):
    """Random page requests through the demo's request path (field checks, clip reading, conditioning,
    streaming): audio events, or a ZonosInputError whose message the page shows; the model is free after each."""
    gr = pytest.importorskip("gradio")  # noqa: F841 - the demo module needs it
    import gradio_interface as gi

    folder = tmp_path_factory.mktemp("fuzz_uploads")
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(folder))
    monkeypatch.setattr(gi, "LOCK_TIMEOUT_S", 1.0)
    uploads = {name: str(folder / path.name) for name, path in clips.items() if name != "dir"}
    for path in clips.values():
        if path.is_file():
            (folder / path.name).write_bytes(path.read_bytes())
    values = _demo_values(uploads)
    rng = random.Random(22)
    played = 0
    for i in range(50):
        mapping: dict[str, Any] = {"text": "Hello, world!", "max_new_tokens": FRAMES, "randomize_seed": False}
        for name in rng.sample(sorted(values), rng.randint(0, 3)):
            options = values[name]
            mapping[name] = options[0] if rng.random() < 0.3 else rng.choice(options)
        label = f"case {i}: {mapping}"

        def speak(mapping: dict[str, Any]) -> list:
            request = gi.SynthesisRequest.from_mapping(mapping)
            events = gi.synthesis_events(lambda name: demo_model, ["tiny"], request, first_chunk_frames=2,
                                         chunk_frames=4)  # fmt: skip
            return list(events)

        ok, items = run_case(label, speak, mapping)
        assert not gi._generation_lock.locked(), f"{label}: the model is still held"
        if not ok:
            continue
        played += 1
        audio = [item for item in items if isinstance(item, np.ndarray)]
        events = [item["event"] for item in items if isinstance(item, dict)]
        assert events[0] == "start" and events[-1] == "done" and audio, label
        pcm = np.concatenate(audio)
        assert pcm.dtype == np.float32 and np.isfinite(pcm).all() and np.abs(pcm).max() > 0, label
    assert played >= 10


# -- the speech server ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server_client(demo_model):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from zonos.serve import ServerSettings, create_app

    settings = ServerSettings(rate_limit=None, slots=2, queue_size=8, max_new_tokens=FRAMES, max_body_bytes=16_000,
                              max_upload_bytes=200_000, warmup=False)  # fmt: skip
    with TestClient(create_app(lambda: demo_model, settings)) as client:
        yield client


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_fuzz_speech_server(server_client, clips):
    """Random bodies for both speech routes: 200 with decodable, non-silent audio, or a 4xx JSON error with a
    message; never a 5xx."""
    numbers = [NAN, INF, -1, 0, 1e30, True, "2", None, [1.0], {"a": 1}]
    audio = [_b64(clips["voice.wav"]), _b64(clips["1hz.wav"]), _b64(clips["garbage.wav"]), _b64(clips["silent.wav"]),
             _b64(clips["long.flac"]), "not base64!", "", 5]  # fmt: skip
    native = {
        "input": ["Hello there.", "", "\u200b", "1" * 40, 5, None, "a" * 5000],
        "language": ["en-us", "de", "xx", 5],
        "voice": ["default", "alloy", "nobody", ""],
        "speaker_audio": audio,
        "prefix_audio": audio,
        "emotion": [[0.3] * 8, [0.0] * 8, [-1.0] * 8, [1.0] * 7, "x"],
        "fmax": [22050.0, *numbers],
        "pitch_std": [20.0, *numbers],
        "speaking_rate": [15.0, *numbers],
        "vqscore_8": [[0.78] * 8, [NAN] * 8, [0.7]],
        "unconditional_keys": [["emotion"], ["mood"], "emotion"],
        "seed": [0, -1, 2**64, 1.5, "x"],
        "cfg_scale": [2.0, *numbers],
        "sampling": [{"min_p": 0.1}, {"min_p": 2.0}, {"temperature": NAN}, {"nucleus": 1}, "x"],
        "max_new_tokens": [4, 0, 10**6, "x"],
        "first_chunk_frames": [1, 0, -1],
        "chunk_frames": [4, 0],
        "response_format": ["pcm", "wav", "flac", "aiff", 5],
        "stream_format": ["audio", "sse", "video"],
        "pitch_sdt": [3],
    }  # fmt: skip
    openai = {
        "input": ["Hello there.", "", "a" * 5000, None],
        "voice": ["alloy", "default", "nobody"],
        "speed": [1.0, 0.25, 4.0, 9, NAN, "fast"],
        "response_format": ["pcm", "wav", "mp3", "aiff"],
        "stream_format": ["audio", "sse", "video"],
        "model": ["tts-1", 5],
        "instructions": ["speak softly"],
    }
    rng = random.Random(23)
    answered = 0
    for i in range(50):
        route, fields = ("/v1/zonos/speech", native) if rng.random() < 0.6 else ("/v1/audio/speech", openai)
        body = {"input": "Hello there.", "response_format": "pcm"}
        if route == "/v1/zonos/speech":
            body["max_new_tokens"] = 4
        for name in rng.sample(sorted(fields), rng.randint(0, 3)):
            body[name] = fields[name][0] if rng.random() < 0.3 else rng.choice(fields[name])
        label = f"case {i}: POST {route} {str(body)[:300]}"
        with time_limit(CASE_SECONDS):
            resp = server_client.post(route, content=_json(body), headers={"content-type": "application/json"})
        assert resp.status_code < 500, f"{label}: {resp.status_code} {resp.text[:300]}"
        if resp.status_code != 200:
            error = resp.json()["error"]
            assert 400 <= resp.status_code < 500 and error["message"], label
            continue
        answered += 1
        data = resp.content
        if body.get("stream_format") == "sse":
            assert b"data:" in data, label
            continue
        samples = _decode(data, body.get("response_format", "mp3" if route == "/v1/audio/speech" else "wav"))
        assert samples.size and np.isfinite(samples).all() and np.abs(samples).max() > 0, label
    assert answered >= 10


def _json(body: dict) -> bytes:
    import json

    return json.dumps(body).encode()  # NaN and Infinity as Python writes them, which lenient parsers accept


def _decode(data: bytes, fmt: str) -> np.ndarray:
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32)
    return sf.read(io.BytesIO(data), dtype="float32")[0]
