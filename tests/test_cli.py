"""The ``zonos-tts`` command line (and sample.py) end to end on a tiny local checkpoint and codec.

Every subcommand runs for real on the tiny model; most tests reuse one loaded model (``load_model`` is
patched to hand it out and count the loads), and one test loads it from its directory as a user would.
"""

from __future__ import annotations

import errno
import io
import math
import re
import struct
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import sample
from tests.tiny import save_tiny_checkpoint, tiny_codec
from zonos import cli
from zonos.cli import bench, speak, voice
from zonos.cli.common import DEFAULT_SPEAKER_MODEL, load_model
from zonos.conditioning.segments import split_text
from zonos.errors import ZonosInputError
from zonos.longform import prefix_lengths, speak_segments
from zonos.speaker import SpeakerEmbedding, SpeakerNetConfig
from zonos.speaker.network import ResNetSimAMASP
from zonos.speaker.voices import VOICE_FORMAT

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Testing one, two."
FRAMES = 16
SR = 44100
TINY_SPEAKER = SpeakerNetConfig(in_planes=4, num_blocks=(1, 1, 1, 1), attention_dim=8, embed_dim=16, lda_dim=128)


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    (root / "model").mkdir()
    save_tiny_checkpoint(root / "model", "transformer")
    tiny_codec().save_pretrained(root / "codec")
    return root / "model", root / "codec"


@pytest.fixture(scope="module")
def common(dirs):
    model_dir, codec_dir = dirs
    return ["--model", str(model_dir), "--codec", str(codec_dir), "--device", "cpu", "--seed", "1"] + [
        "--max-new-tokens",
        str(FRAMES),
        "--no-progress",
    ]


@pytest.fixture(scope="module")
def loaded(common):
    """The tiny model, loaded once through the CLI's own loader."""
    args = speak.build_parser("t", "x.wav").parse_args(["x", *common])
    return load_model(args, torch.device("cpu"))


@pytest.fixture
def loads(monkeypatch, loaded):
    """Patch the CLI's loader to hand out the loaded model; the list counts the loads."""
    calls = []

    def load(args, device):
        calls.append(args.model)
        return loaded

    for module in (speak, bench):
        monkeypatch.setattr(module, "load_model", load)
    return calls


@pytest.fixture
def no_load(monkeypatch):
    """Any model load fails the test: bad input must be refused before one."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for bad input")

    for module in (speak, bench):
        monkeypatch.setattr(module, "load_model", refuse)
    monkeypatch.setattr(SpeakerEmbedding, "from_pretrained", classmethod(refuse))


@pytest.fixture(scope="module")
def tiny_speaker():
    g = torch.Generator().manual_seed(3)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in ResNetSimAMASP(TINY_SPEAKER).state_dict().items()}
    net = {}
    for name, shape in shapes.items():
        if name.endswith("num_batches_tracked"):
            net[name] = torch.tensor(1)
        elif name.endswith("running_var"):
            net[name] = 0.5 + torch.rand(shape, generator=g)
        elif len(shape) == 1:
            net[name] = 0.1 * torch.randn(shape, generator=g) + (0 if "bias" in name or "mean" in name else 1)
        else:
            net[name] = torch.randn(shape, generator=g) * math.sqrt(2 / math.prod(shape[1:]))
    lda = {"weight": torch.randn(128, 16, generator=g) / 4, "bias": 0.1 * torch.randn(128, generator=g)}
    return SpeakerEmbedding.from_state_dicts(net, lda, config=TINY_SPEAKER)


@pytest.fixture
def speaker_model(monkeypatch, tiny_speaker):
    """SpeakerEmbedding.from_pretrained hands out the tiny speaker model (the real one is a download)."""
    calls = []

    def from_pretrained(cls, repo_id="default", *args, **kwargs):
        calls.append(str(repo_id))
        return tiny_speaker

    monkeypatch.setattr(SpeakerEmbedding, "from_pretrained", classmethod(from_pretrained))
    return calls


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """1.2 s of a speech-like signal at 24 kHz."""
    path = tmp_path_factory.mktemp("clip") / "voice.wav"
    t = np.arange(int(1.2 * 24000)) / 24000
    rng = np.random.default_rng(0)
    wav = 0.3 * np.sin(2 * np.pi * 170 * t) * np.sin(2 * np.pi * 3 * t) + 0.05 * rng.standard_normal(t.size)
    sf.write(path, wav.astype(np.float32), 24000, subtype="FLOAT")
    return path


def run(argv, capsys, stdin: str | None = None, entry=None) -> tuple[int, bytes, str]:
    """Run the command line with a binary stdout; returns (exit status, stdout bytes, stderr)."""
    out = io.BytesIO()
    saved = sys.stdout, sys.stdin
    sys.stdout = wrapper = io.TextIOWrapper(out, write_through=True)  # kept: collecting it would close `out`
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        code = (entry or cli.main)(argv)
    except SystemExit as e:
        code = e.code
    finally:
        wrapper.flush()
        sys.stdout, sys.stdin = saved
    return code, out.getvalue(), capsys.readouterr().err


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def read(path_or_bytes):
    source = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with sf.SoundFile(source) as f:
        return f.read(dtype="float32"), f.samplerate, f.subtype


# -------------------------------------------------------------------------------------------- speak


@pytest.fixture(scope="module")
def reference(common, tmp_path_factory):
    """TEXT spoken one-shot into a float wav, the model loaded from its directory (the real path)."""
    out = tmp_path_factory.mktemp("ref") / "ref.wav"
    assert cli.main(["speak", TEXT, *common, "--out", str(out), "--sample-format", "float"]) == 0
    audio, sr, subtype = read(out)
    assert sr == SR and subtype == "FLOAT" and audio.size and audio.size % 512 == 0
    assert np.abs(audio).max() > 1e-3
    return audio


def test_each_file_format_one_shot_and_streamed(reference, common, loads, tmp_path, capsys):
    step = 1 / 32768  # libsndfile's 16-bit scale
    cases = [  # (name, extra flags, subtype)
        ("a.wav", [], "PCM_16"),
        ("b.wav", ["--stream", "--chunk-frames", "3"], "PCM_16"),
        ("c.wav", ["--stream", "--sample-format", "float"], "FLOAT"),
        ("d.flac", ["--stream", "--first-chunk-frames", "2"], "PCM_16"),
        ("e.flac", ["--sample-format", "pcm16"], "PCM_16"),
    ]
    for name, flags, subtype in cases:
        out = tmp_path / name
        out.write_bytes(b"poison: must be replaced")
        code, _, err = run(["speak", TEXT, *common, "--out", str(out), *flags], capsys)
        assert code == 0, err
        audio, sr, got = read(out)
        assert (sr, got, audio.size) == (SR, subtype, reference.size), name
        stream = "--stream" in flags
        # 16-bit output is the float reference within one step; a streamed run of the same seed gives the
        # same audio up to float rounding.
        tolerance = (step if subtype == "PCM_16" else 0) + (1e-4 if stream else 1e-7)
        assert np.abs(audio - reference).max() <= tolerance, name
        assert ("time to first audio" in err) == stream
        assert "reached --max-new-tokens" in err  # the tiny model never ends by itself within 16 frames
    # Vorbis is lossy: same length and rate, and the waveform is close to the reference.
    code, _, err = run(["speak", TEXT, *common, "--out", str(tmp_path / "f.ogg")], capsys)
    assert code == 0, err
    audio, sr, subtype = read(tmp_path / "f.ogg")
    assert (sr, subtype, audio.size) == (SR, "VORBIS", reference.size)
    assert np.corrcoef(audio, reference)[0, 1] > 0.5  # Vorbis keeps the spectrum more than the waveform
    assert 0.7 < np.sqrt(np.mean(audio**2) / np.mean(reference**2)) < 1.3
    assert len(loads) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav", "b.wav", "c.wav", "d.flac", "e.flac", "f.ogg"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("sample_format", ["pcm16", "float"])
def test_stdin_to_stdout(reference, common, loads, capsys, stream, sample_format):
    flags = ["--stream"] if stream else []
    code, data, err = run(
        ["speak", "-", *common, "--out", "-", "--sample-format", sample_format, *flags], capsys, stdin=TEXT + "\n"
    )
    assert code == 0, err
    width = 2 if sample_format == "pcm16" else 4
    riff, _, _, _, _, tag, channels, sr, _, _, bits, _, size = struct.unpack("<4sI4s4sIHHIIHH4sI", data[:44])
    assert (riff, tag, channels, sr, bits) == (b"RIFF", 1 if width == 2 else 3, 1, SR, 8 * width)
    assert size == (0xFFFFFFFF if stream else len(data) - 44)  # a stream's length is unknown when the header goes
    samples = np.frombuffer(data[44:], dtype="<i2" if width == 2 else "<f4")
    assert samples.size == reference.size
    as_file = io.BytesIO()  # what a file of this sample format holds
    sf.write(as_file, reference, SR, format="WAV", subtype="PCM_16" if width == 2 else "FLOAT")
    expected = read(as_file.getvalue())[0]
    got = samples / 32768 if width == 2 else samples
    assert np.abs(got - expected).max() <= (1e-4 + (1 / 32768 if width == 2 else 0) if stream else 0)
    audio, rate, _ = read(data)  # what a player reading the pipe sees
    assert rate == SR and audio.size == reference.size


def test_text_from_a_file_and_sample_py(common, loads, tmp_path, capsys):
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    code, _, err = run(["speak", "-f", str(tmp_path / "text.txt"), *common, "--out", str(tmp_path / "f.wav")], capsys)
    assert code == 0, err
    code, _, err = run([*common, "--out", str(tmp_path / "s.wav")], capsys, entry=sample.main)  # default text
    assert code == 0, err
    code, _, err = run([TEXT, *common, "--out", str(tmp_path / "t.wav")], capsys, entry=sample.main)
    assert code == 0, err
    file_audio, sample_audio, text_audio = (read(tmp_path / n)[0] for n in ("f.wav", "s.wav", "t.wav"))
    assert np.array_equal(file_audio, text_audio)
    assert sample_audio.size == text_audio.size and not np.array_equal(sample_audio, text_audio)


LONG = "The first sentence is here. A second one follows, with a comma in it. And a third closes the text."


def test_long_text_is_one_utterance_with_every_segment_reported(common, loads, loaded, tmp_path, capsys):
    segments = split_text(LONG, 45)
    assert len(segments) == 3
    for flags in ([], ["--stream"]):
        out = tmp_path / f"long{len(flags)}.wav"
        code, _, err = run(
            [
                *("speak", LONG, *common, "--max-new-tokens", "8", "--max-segment-chars", "45", "--out", str(out)),
                *("--sample-format", "float", *flags),
            ],
            capsys,
        )
        assert code == 0, err
        assert "speaking 3 segments" in err
        for k in (1, 2, 3):  # the tiny model never ends by itself: each segment stops at the flag
            assert f"warning: segment {k} of 3 reached --max-new-tokens (8 frames, 0.1 s)" in err
        # The same as zonos.longform speaking the segments with the seeded generator.
        codes = speak_segments(
            loaded, segments, cond={"language": "en-us", "device": "cpu"}, max_new_tokens=8, progress_bar=False,
            generator=torch.Generator().manual_seed(1),
        )  # fmt: skip
        expected = loaded.autoencoder.decode(codes)[0, 0].numpy()
        audio = read(out)[0]
        assert codes.shape[-1] == 24 and audio.size == expected.size and np.abs(audio - expected).max() < 1e-4


def test_long_text_fits_the_sequence_with_default_flags(dirs, loads, loaded, tmp_path, capsys):
    # A short sequence, so each segment's 2580 frames (--max-new-tokens' default) would fill it: every segment
    # gets what the positions leave it beside the previous segment's audio, and says so.
    model_dir, codec_dir = dirs
    segments = split_text(LONG, 45)
    seqlen = loaded.engine.max_seqlen
    loaded.start_engine(max_seqlen=200)
    try:
        lengths = prefix_lengths(loaded, segments)
        out = tmp_path / "long.wav"
        argv = ["speak", LONG, "--model", str(model_dir), "--codec", str(codec_dir), "--device", "cpu", "--seed", "1"]
        code, _, err = run([*argv, "--no-progress", "--max-segment-chars", "45", "--stream", "--out", str(out)], capsys)
    finally:
        loaded.start_engine(max_seqlen=seqlen)
    assert code == 0, err
    budgets, previous = [], 0
    for k, length in enumerate(lengths):
        room = 200 - 9 - length - previous
        previous = min(room, (200 - 9 - lengths[k + 1]) // 2) if k + 1 < len(lengths) else room
        budgets.append(previous)
        assert f"segment {k + 1} of 3 reached the most frames the model's positions leave it ({previous} frames" in err
    assert read(out)[0].size == 512 * sum(budgets) and all(b > 20 for b in budgets)


def test_a_failure_leaves_no_partial_file(common, loads, loaded, monkeypatch, tmp_path, capsys):
    real = loaded.generate
    sizes = []

    def failing(prefix, stream=False, **kwargs):
        if not stream:
            raise ZonosInputError("the engine refused it:\nsecond line of detail")

        def chunks():
            for i, chunk in enumerate(real(prefix, stream=True, **kwargs)):
                if i == 2:
                    sizes.extend(p.stat().st_size for p in tmp_path.glob(".out.wav.*.part"))
                    raise RuntimeError("the GPU fell off the bus")
                yield chunk

        return chunks()

    monkeypatch.setattr(loaded, "generate", failing)
    out = tmp_path / "out.wav"
    out.write_bytes(b"the previous take")
    with pytest.raises(RuntimeError, match="fell off"):
        run(["speak", TEXT, *common, "--out", str(out), "--stream", "--chunk-frames", "1"], capsys)
    capsys.readouterr()
    assert len(sizes) == 1 and sizes[0] > 44  # the stream was being written progressively into a temp file
    assert out.read_bytes() == b"the previous take" and [p.name for p in tmp_path.iterdir()] == ["out.wav"]
    # An input error raised after loading: one line, status 2, and again nothing written.
    code, _, err = run(["speak", TEXT, *common, "--out", str(out)], capsys)
    assert code == 2 and one_line_error(err) == "error: the engine refused it: second line of detail"
    assert out.read_bytes() == b"the previous take" and [p.name for p in tmp_path.iterdir()] == ["out.wav"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_disk_is_one_line_and_leaves_no_file(common, loads, monkeypatch, tmp_path, capsys, stream):
    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sf.SoundFile, "write", full)
    out = tmp_path / "out.wav"
    code, _, err = run(["speak", TEXT, *common, "--out", str(out), *(["--stream"] if stream else [])], capsys)
    assert code == 1
    assert [line for line in err.splitlines() if not line.startswith(("warning", "time to"))] == [
        f"error: cannot write {out}: no space left on the device; free some space, or write the audio elsewhere (--out)"
    ]
    assert list(tmp_path.iterdir()) == []  # the temporary file went too


def test_a_full_standard_output_is_one_line(common, loads, monkeypatch, capsys):
    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(Full())))
    code = cli.main(["speak", TEXT, *common, "--out", "-"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and err[-1].startswith("error: cannot write standard output: no space left on the device")
    assert not any("Traceback" in line for line in err)


def test_a_reader_that_closes_the_pipe_early_ends_in_one_line(common):
    # 300 frames of 16-bit audio are 300 KiB, more than a pipe holds: the writer is still writing when the reader
    # goes, as with `zonos-tts speak ... --out - | head -c 10`.
    argv = [*common, "--max-new-tokens", "300", "--stream", "--chunk-frames", "1", "--out", "-"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "zonos", "speak", TEXT, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    assert proc.stdout.read(10)[:4] == b"RIFF"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert err.strip().splitlines()[-1].startswith("error: standard output was closed by its reader before the audio")
    assert "Traceback" not in err and "Exception ignored" not in err


def test_a_corrupt_checkpoint_is_one_line_naming_the_file(dirs, tmp_path, capsys):
    """A truncated model.safetensors (an interrupted download), loaded for real: one line that names the file and
    says to download it again, status 2."""
    model_dir, codec_dir = dirs
    broken = tmp_path / "model"
    broken.mkdir()
    (broken / "config.json").write_bytes((model_dir / "config.json").read_bytes())
    (broken / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes()[:5000])
    argv = ["speak", TEXT, "--model", str(broken), "--codec", str(codec_dir), "--device", "cpu", "--no-progress"]
    code, _, err = run([*argv, "--out", str(tmp_path / "x.wav")], capsys)
    line = one_line_error(err.strip().splitlines()[-1])
    assert code == 2 and str(broken / "model.safetensors") in line and "download" in line


# ------------------------------------------------------------------------------------ voice, bench, demo


def test_voice_file_round_trip(common, loads, speaker_model, clip, tmp_path, monkeypatch, capsys, tiny_speaker):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["voice", str(clip), "--device", "cpu"], capsys)
    assert code == 0, err
    record = torch.load(tmp_path / "voice.pt", weights_only=True)  # default name: the clip's, with .pt
    assert record["format"] == VOICE_FORMAT and record["clip"] == "voice.wav"
    from zonos.audio import load_audio

    assert torch.equal(record["embedding"], tiny_speaker.embed(*load_audio(clip)))
    assert speaker_model == [DEFAULT_SPEAKER_MODEL]

    outs = {}
    for name, flags in (("voice", ["--voice", "voice.pt"]), ("clip", ["--speaker-audio", str(clip)]), ("none", [])):
        code, _, err = run(["speak", TEXT, *common, "--out", f"{name}.wav", *flags], capsys)
        assert code == 0, err
        outs[name] = read(tmp_path / f"{name}.wav")[0]
    assert np.array_equal(outs["voice"], outs["clip"])  # the saved voice is the clip's voice
    assert not np.array_equal(outs["voice"], outs["none"])


def test_bench_prints_a_table(common, loads, capsys):
    code, data, err = run(["bench", *common, "--runs", "2", "--chunk-frames", "4"], capsys)
    assert code == 0, err
    table = data.decode()
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[1].replace(".", "").isdigit():
            rows[cells[0]] = [float(c) for c in cells[1:]]
    assert set(rows) == {
        "time to first audio (ms)",
        "real-time factor, streamed (x)",
        "real-time factor, one-shot (x)",
        "decode step (ms)",
        "conditioning (ms)",
    }, table
    for label, (median, low, high) in rows.items():
        assert 0 < low <= median <= high, label
    assert "on cpu" in table and "cute_gemv=off" in table


def test_demo_passes_its_arguments_through(monkeypatch):
    seen = []
    demo = types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0)
    monkeypatch.setitem(sys.modules, "gradio_interface", demo)  # the real one is tested in its own file
    assert cli.main(["demo", "--port", "7861", "--no-preload"]) == 0
    assert seen == [["--port", "7861", "--no-preload"]]


# ------------------------------------------------------------------------------------------ bad input


@pytest.fixture(scope="module")
def files(tmp_path_factory, clip):
    d = tmp_path_factory.mktemp("files")
    (d / "empty.txt").write_text("  \n", encoding="utf-8")
    (d / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (d / "junk.pt").write_bytes(b"\x00not a torch file")
    torch.save({"embedding": torch.zeros(128)}, d / "nomarker.pt")
    torch.save(torch.randn(64), d / "short.pt")
    torch.save({"format": VOICE_FORMAT, "version": 1, "embedding": torch.full((128,), float("nan"))}, d / "nan.pt")
    sf.write(d / "tiny.wav", np.zeros(800, dtype=np.float32), 16000)
    sf.write(d / "1hz.wav", np.full(2000, 0.1, dtype=np.float32), 1)  # 4 KB whose header claims 1 Hz
    (d / "notaudio.wav").write_bytes(b"\x00" * 100)
    (d / "nomodel").mkdir()
    return d


SPEAK_CASES = [
    ([], "no text: give it as an argument"),
    (["  "], "the text is empty"),
    (["<>"], "has nothing eSpeak can pronounce"),
    ([TEXT, "--text", "again"], "the text is given twice (TEXT and --text)"),
    (["-f", "{d}/missing.txt"], "-f {d}/missing.txt: no such file"),
    (["-f", "{d}/empty.txt"], "-f {d}/empty.txt is empty"),
    (["-f", "{d}/latin1.txt"], "cannot read it as UTF-8 text"),
    ([TEXT, "--language", "english"], "--language: "),
    ([TEXT, "--out", "x.mp3"], "unknown audio format '.mp3'; name it .wav, .flac or .ogg"),
    ([TEXT, "--out", "{d}/no/such/dir/x.wav"], "the directory {d}/no/such/dir does not exist"),
    ([TEXT, "--out", "{d}"], "is a directory; give a file name"),
    ([TEXT, "--out", "x.flac", "--sample-format", "float"], "FLAC stores integer samples"),
    ([TEXT, "--out", "x.ogg", "--sample-format", "pcm16"], ".ogg is Vorbis, which has no sample format"),
    ([TEXT, "--sample-format", "double"], "argument --sample-format: invalid choice"),
    ([TEXT, "--chunk-frames", "4"], "--chunk-frames applies only to streaming: add --stream"),
    ([TEXT, "--stream", "--first-chunk-frames", "0"], "--first-chunk-frames must be at least 1"),
    ([TEXT, "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    ([TEXT, "--max-new-tokens", "5000"], "--max-new-tokens 5000: the model has 4096 positions"),
    ([TEXT, "--max-segment-chars", "0"], "--max-segment-chars must be at least 1"),
    ([TEXT, "--cfg-scale", "0"], "--cfg-scale must be a positive number"),
    ([TEXT, "--cfg-scale", "1e300"], "--cfg-scale must be a positive number up to 10000"),
    ([TEXT, "--conf=-3e38"], "sampling: conf must lie in"),
    ([TEXT, "--top-k", str(2**63)], "sampling: top_k must"),
    ([TEXT, "--seed", "-1"], "--seed must be a non-negative integer"),
    ([TEXT, "--top-p", "2"], "sampling: top_p"),
    ([TEXT, "--min-p", "nan"], "--min-p must be a finite number"),
    ([TEXT, "--top-k", "1.5"], "argument --top-k: invalid int value"),
    ([TEXT, "--pitch-std", "1000"], "--pitch-std must lie in 0..400"),
    ([TEXT, "--emotion", *["0"] * 8], "--emotion takes 8 non-negative weights, not all zero"),
    ([TEXT, "--emotion", "1", "2"], "argument --emotion: expected 8 arguments"),
    ([TEXT, "--unconditional", "mood"], "--unconditional mood: unknown key"),
    ([TEXT, "--voice", "{d}/a.pt", "--speaker-audio", "{clip}"], "give either --voice or --speaker-audio, not both"),
    ([TEXT, "--voice", "{d}/missing.pt"], "--voice {d}/missing.pt: no such file"),
    ([TEXT, "--voice", "{clip}"], "is an audio clip, not a voice file; pass it as --speaker-audio"),
    ([TEXT, "--voice", "{d}/junk.pt"], "not a voice file from `zonos-tts voice`"),
    ([TEXT, "--voice", "{d}/nomarker.pt"], "a dict without the 'zonos-voice' marker"),
    ([TEXT, "--voice", "{d}/short.pt"], "holds no 128-value speaker embedding"),
    ([TEXT, "--voice", "{d}/nan.pt"], "the embedding has NaN or infinite values"),
    ([TEXT, "--speaker-audio", "{d}/tiny.wav"], "0.05 s is too short"),
    ([TEXT, "--speaker-audio", "{d}/1hz.wav"], "sample rate 1 Hz is outside 8000..768000 Hz"),
    ([TEXT, "--speaker-audio", "{d}/notaudio.wav"], "not a readable audio file"),
    ([TEXT, "--model", "{d}/missing"], "--model {d}/missing: no such directory, and not a Hugging Face repo id"),
    ([TEXT, "--model", "{d}/nomodel"], "the directory has no config.json or model.safetensors"),
    ([TEXT, "--codec", "not a repo"], "--codec not a repo: no such directory"),
    ([TEXT, "--device", "nonsense"], "--device 'nonsense' is not a device name"),
    ([TEXT, "--device", "mps"], "--device 'mps' is not available on this machine"),
    ([TEXT, "--device", "cpu", "--cute-gemv"], "--cute-gemv runs CUDA kernels"),
    ([TEXT, "--device", "cpu", "--fused-blocks"], "--fused-blocks runs CUDA kernels"),
    ([TEXT, "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
]


def _fill(argv, d, clip):
    return [a.format(d=d, clip=clip) for a in argv]


@pytest.mark.parametrize("argv,message", SPEAK_CASES, ids=[m[:40] for _, m in SPEAK_CASES])
def test_bad_speak_input_is_one_line_before_loading(argv, message, files, clip, no_load, tmp_path, capsys):
    argv = ["speak", *_fill(argv, files, clip), "--no-progress"]
    if "--device" not in argv:
        argv += ["--device", "cpu"]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "x.wav")]
    code, _, err = run(argv, capsys)
    assert code == 2
    assert message.format(d=files, clip=clip) in one_line_error(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv,message",
    [
        (["voice", "{d}/missing.wav"], "CLIP {d}/missing.wav: no such file"),
        (["voice", "{d}/tiny.wav"], "too short"),
        (["voice", "{d}/1hz.wav"], "sample rate 1 Hz is outside"),
        (["voice", "{clip}", "--out", "{d}/v.wav"], "would overwrite audio with a voice file; name it .pt"),
        (["voice", "{clip}", "--out", "{d}/none/v.pt"], "the directory {d}/none does not exist"),
        (["voice", "{clip}", "--speaker-model", "{d}/nomodel"], "the directory has no ResNet293_SimAM_ASP_base.pt"),
        (["voice", "{clip}", "--device", "nonsense"], "--device 'nonsense' is not a device name"),
        (["bench", "--runs", "0", "--device", "cpu"], "--runs must be at least 1"),
        (["bench", "--text", " ", "--device", "cpu"], "--text is empty"),
        (["bench", "--language", "xx", "--device", "cpu"], "--language: "),
        (["bench", "--device", "cpu", "--cute-gemv"], "--cute-gemv runs CUDA kernels"),
        (["bench", "--model", "{d}/missing"], "no such directory"),
        (["warmup", "--compile-processes", "-1", "--device", "cpu"], "--compile-processes -1: must be 0 or more"),
        (["transcribe"], "argument COMMAND: invalid choice: 'transcribe'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_input_to_other_commands_is_one_line_before_loading(argv, message, files, clip, no_load, capsys):
    code, _, err = run(_fill(argv, files, clip), capsys)
    assert code == 2
    assert message.format(d=files, clip=clip) in one_line_error(err)


def test_stdout_that_is_a_terminal_is_refused(no_load, monkeypatch, capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    assert cli.main(["speak", TEXT, "--out", "-"]) == 2
    assert "standard output is a terminal" in one_line_error(capsys.readouterr().err)
    monkeypatch.setattr(sys, "stdout", None)  # started with stdout closed (>&-)
    assert cli.main(["speak", TEXT, "--out", "-"]) == 2
    assert "there is no standard output (it is closed)" in one_line_error(capsys.readouterr().err)


def test_cuda_without_cuda_is_refused(no_load, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run(["speak", TEXT, "--device", "cuda"], capsys)
    assert code == 2 and "--device 'cuda' is not available on this machine" in one_line_error(err)


def test_help_on_every_command_and_flag(capsys):
    for command in ("speak", "voice", "bench"):
        code, data, _ = run([command, "--help"], capsys)
        assert code == 0
        parser = {"speak": speak.build_parser, "voice": voice.build_parser, "bench": bench.build_parser}[command]
        parser = parser("p", "x.wav") if command == "speak" else parser("p")
        for action in parser._actions:
            assert action.help, f"{command} {action.option_strings or action.dest} has no help"
    code, data, _ = run(["--help"], capsys)
    assert code == 0 and all(c in data.decode() for c in ("speak", "voice", "bench", "demo"))


def test_console_script_and_version():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    module, _, name = project["project"]["scripts"]["zonos-tts"].partition(":")
    assert (module, name) == ("zonos.cli", "main") and callable(getattr(cli, name))
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "zonos.__version__"}
    import zonos

    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", zonos.__version__)
    result = subprocess.run(
        [sys.executable, "-c", "import sys, zonos; print(zonos.__version__, 'torch' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.stdout.split() == [zonos.__version__, "False"]  # `import zonos` stays light
    result = subprocess.run([sys.executable, "-m", "zonos", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == f"zonos-tts {zonos.__version__}"


# ------------------------------------------------------------------------------------------- warmup


def test_warmup_on_the_cpu_has_nothing_to_compile(dirs, tmp_path, capsys):
    model_dir, codec_dir = dirs
    argv = ["warmup", "--model", str(model_dir), "--codec", str(codec_dir), "--device", "cpu", "--no-progress"]
    code, out, err = run([*argv, "--kernel-cache", str(tmp_path / "kernels")], capsys)
    assert code == 0 and out == b"", err
    assert f"loaded {model_dir} on cpu" in err  # the model loads (a setup step also downloads it)
    assert "nothing to compile on cpu" in err and str(tmp_path / "kernels") in err
    assert not (tmp_path / "kernels").exists()  # nothing is written where nothing compiles


class _FakeCudaModel:
    """What ``warmup`` calls on a CUDA model, recorded."""

    def __init__(self):
        self.calls = []
        self.engine = types.SimpleNamespace(slots=types.SimpleNamespace(count=4))

    def start_engine(self, slots):
        self.calls.append(("start_engine", slots))
        self.engine.slots.count = slots

    def warmup(self, **kwargs):
        self.calls.append(("warmup", kwargs))
        return 1.0


@pytest.fixture
def fake_cuda(monkeypatch):
    """``warmup`` sees a CUDA device, a fake model, and a kernel cache that is resolved but not applied (applying
    sets this process's compiler variables; tests/test_kernel_cache.py covers it in fresh processes)."""
    from zonos.cli import warmup
    from zonos_accel import kernel_cache

    model, chosen = _FakeCudaModel(), []
    monkeypatch.setattr(warmup, "check_device", lambda spec, args: torch.device("cuda"))
    monkeypatch.setattr(warmup, "load_model", lambda args, device: model)

    def use(path=None):
        chosen.append(path)
        return kernel_cache.kernel_cache_dirs(path)

    monkeypatch.setattr(kernel_cache, "use_kernel_cache", use)
    return model, chosen


def test_warmup_on_cuda_compiles_every_prefill_length_and_names_the_cache(dirs, fake_cuda, tmp_path, capsys):
    model_dir, codec_dir = dirs
    model, chosen = fake_cuda
    argv = ["warmup", "--model", str(model_dir), "--codec", str(codec_dir), "--streams", "8", "--min-p", "0"]
    code, out, err = run([*argv, "--cfg-scale", "1.5", "--kernel-cache", str(tmp_path), "--no-progress"], capsys)
    assert code == 0, err
    assert chosen == [str(tmp_path)]  # chosen before the model loads
    assert model.calls == [
        ("start_engine", 8),  # 8 streams need 8 slots
        (
            "warmup",
            dict(
                cfg_scale=1.5,
                sampling_params={"min_p": 0.0},
                streams=8,
                all_prefill_lengths=True,
                progress_bar=False,
                compile_processes=0,
            ),
        ),
    ]
    assert re.search(rf"warmed up in \d+\.\d s; the compiled kernels are kept in {re.escape(str(tmp_path))}$", err)


def _refuse_to_load(args, device):
    raise AssertionError("a model was loaded for bad input")


def test_warmup_refuses_an_unwritable_kernel_cache_before_loading(dirs, monkeypatch, tmp_path, capsys):
    from zonos.cli import warmup
    from zonos_accel import kernel_cache

    monkeypatch.setattr(warmup, "check_device", lambda spec, args: torch.device("cuda"))
    monkeypatch.setattr(warmup, "load_model", _refuse_to_load)
    monkeypatch.setattr(kernel_cache, "_applied", None)
    (tmp_path / "file").write_text("")
    model_dir, codec_dir = dirs
    argv = ["warmup", "--model", str(model_dir), "--codec", str(codec_dir), "--kernel-cache", str(tmp_path / "file")]
    code, _, err = run(argv, capsys)
    assert code == 2
    line = one_line_error(err)
    assert f"cannot write compiled kernels into {tmp_path / 'file' / 'triton'}" in line and "ZONOS_KERNEL_CACHE" in line


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--streams", "0"], "--streams must be at least 1"), (["--min-p", "2"], "must be in [0, 1]")],
)
def test_bad_warmup_input_is_one_line_before_loading(flags, message, monkeypatch, capsys):
    from zonos.cli import warmup

    monkeypatch.setattr(warmup, "load_model", _refuse_to_load)
    code, _, err = run(["warmup", *flags], capsys)
    assert code == 2 and message in one_line_error(err)


def test_warmup_help_covers_every_flag(capsys):
    from zonos.cli import warmup

    code, data, _ = run(["warmup", "--help"], capsys)
    assert code == 0 and "--kernel-cache DIR" in data.decode()
    for action in warmup.build_parser("p")._actions:
        assert action.help, f"warmup {action.option_strings or action.dest} has no help"
    code, data, _ = run(["--help"], capsys)
    assert code == 0 and "warmup" in data.decode()
