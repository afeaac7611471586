"""The ``zonos-tts`` command line: ``speak`` (text to an audio file or stdout), ``voice`` (a clip to a saved
speaker embedding), ``bench`` (time to first audio, real-time factor and step time here) and ``demo``.

Every argument is checked before a model loads: a bad one prints one ``error: ...`` line and exits with
status 2, and so does a :class:`zonos.errors.ZonosInputError` (any ``ValueError``) raised after loading.
Output files are written to a temporary file beside the target and renamed into place at the end, so a
failure never leaves a partial file. Status lines go to stderr; stdout carries only audio (``--out -``) or
the ``bench`` table.

Text longer than one generation's budget is split into segments with
:func:`zonos.conditioning.segments.split_text`. When ``zonos.longform.speak_segments`` exists it speaks
them as one utterance (``speak_segments(model, segments, cond=..., stream=..., **generate_kwargs)``, returning
what ``Zonos.generate`` returns: codes, or an iterator of audio chunks); otherwise each segment is generated
on its own and the audio is concatenated.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import math
import os
import re
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from zonos import __version__

__all__ = ["VOICE_FORMAT", "UsageError", "load_model", "load_voice", "main", "save_voice", "speak_main"]

DEFAULT_MODEL = "Zyphra/Zonos-v0.1-hybrid"
DEFAULT_CODEC = "descript/dac_44khz"
DEFAULT_SPEAKER_MODEL = "Zyphra/Zonos-v0.1-speaker-embedding"
VOICE_FORMAT = "zonos-voice"  # the marker in a saved voice file (a dict), so other .pt files are told apart
VOICE_VERSION = 1
CONTAINERS = {".wav": "WAV", ".flac": "FLAC", ".ogg": "OGG"}
MAX_SEQLEN = 4096  # the published models' positions: prefix + frames + 9 delay steps must fit
FRAMES_PER_SECOND = 44100 / 512
BENCH_TEXT = (
    "The quick brown fox jumps over the lazy dog. A streaming model hands out audio while it is still "
    "generating, so the listener hears the first words almost at once."
)
# Leading bytes of audio files that someone might pass as --voice by mistake.
_AUDIO_MAGIC = (b"RIFF", b"fLaC", b"OggS", b"ID3", b"\xff\xfb", b"\xff\xf3", b"FORM")


class UsageError(Exception):
    """A bad command-line input, found before any model loads; printed as one ``error:`` line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``error: ... (see PROG --help)``) instead of usage plus message."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _formatter():
    from zonos.utils import HelpFormatter

    return HelpFormatter


# ------------------------------------------------------------------------------------------ arguments


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="Hugging Face repo id (Zyphra/Zonos-v0.1-hybrid or Zyphra/Zonos-v0.1-transformer) or a local directory "
        "holding config.json and model.safetensors",
    )
    p.add_argument(
        "--codec",
        default=DEFAULT_CODEC,
        help="the DAC codec: Hugging Face repo id or a local directory with config.json and model.safetensors",
    )
    p.add_argument("--device", default=None, help="torch device, e.g. cuda, cuda:1 or cpu (default: cuda if available)")
    p.add_argument(
        "--cute-gemv",
        action="store_true",
        help="run the decode projections through our CuTeDSL GEMV instead of cuBLAS (CUDA only; needs "
        "nvidia-cutlass-dsl from pip install 'zonos-accel[gpu]')",
    )
    p.add_argument(
        "--cute-scan",
        action="store_true",
        help="run the prefill's Mamba2 SSD scan (prompts up to 256 tokens) through our CuTeDSL kernel (CUDA only; "
        "needs nvidia-cutlass-dsl from pip install 'zonos-accel[gpu]')",
    )
    p.add_argument(
        "--no-fused-sampling",
        action="store_true",
        help="sample each decode step's tokens with the torch ops (~100 kernels) instead of the two Triton launches "
        "the fast ops use by default (2.07 against 1.91 ms per step on an H200)",
    )
    p.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="run the decode step and prefill eagerly instead of replaying captured CUDA graphs (default on CUDA)",
    )
    p.add_argument(
        "--no-fast-ops",
        action="store_true",
        help="use the torch reference ops instead of the Triton kernels (on by default on CUDA when installed)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    from zonos.model import DEFAULT_CHUNK_FRAMES, DEFAULT_FIRST_CHUNK_FRAMES

    p.add_argument(
        "--language", default="en-us", help="eSpeak language code, e.g. en-us, de, fr-fr, ja, cmn (109 codes)"
    )
    p.add_argument(
        "--seed", type=int, default=None, help="random seed for reproducible speech (default: each run differs)"
    )
    p.add_argument("--cfg-scale", type=float, default=2.0, help="classifier-free guidance scale; 1.0 disables guidance")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=86 * 30,
        help="most frames one generation (one text segment) may take; 86 frames are about one second",
    )
    p.add_argument(
        "--first-chunk-frames",
        type=int,
        default=None,
        help=f"with --stream: frames in the first chunk, after the vocoder's ~10-frame lookahead "
        f"(default: {DEFAULT_FIRST_CHUNK_FRAMES})",
    )
    p.add_argument(
        "--chunk-frames",
        type=int,
        default=None,
        help="with --stream: frames in the steady chunks; the chunks after the first double until they reach it "
        f"(default: {DEFAULT_CHUNK_FRAMES})",
    )
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="on CUDA: skip the warm-up that compiles kernels and captures graphs before the timed request (the "
        "time to first audio then includes them: ~40 s the first time on a machine)",
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--min-p", type=float, default=0.1, help="min-p threshold (0 disables it)")
    g.add_argument("--temperature", type=float, default=None, help="softmax temperature (default 1.0; 0 is greedy)")
    g.add_argument("--top-p", type=float, default=None, help="nucleus (top-p) threshold in [0, 1] (default 0: off)")
    g.add_argument("--top-k", type=int, default=None, help="keep the k most likely codes (default 0: off)")
    g.add_argument("--linear", type=float, default=None, help="unified sampler: linear term (default 0: off)")
    g.add_argument("--conf", type=float, default=None, help="unified sampler: confidence term (default 0)")
    g.add_argument("--quad", type=float, default=None, help="unified sampler: quadratic term (default 0)")
    g.add_argument(
        "--repetition-penalty", type=float, default=None, help="divides recent codes' logits (default 3.0; 1 is off)"
    )
    g.add_argument(
        "--repetition-penalty-window", type=int, default=None, help="recent frames the penalty looks at (default 2)"
    )


def _add_voice_args(p: argparse.ArgumentParser) -> None:
    from zonos.conditioning import DEFAULT_EMOTION

    g = p.add_argument_group("voice and style")
    g.add_argument(
        "--voice",
        "--speaker-embedding",
        dest="voice",
        default=None,
        metavar="FILE",
        help="a voice file from `zonos-tts voice` (or a 128-value embedding tensor saved with torch.save); "
        "without a voice the model's learned unconditional speaker is used",
    )
    g.add_argument(
        "--speaker-audio",
        default=None,
        metavar="CLIP",
        help="a voice clip (wav/flac/ogg, at least 0.5 s of speech) to clone; the speaker model "
        f"({DEFAULT_SPEAKER_MODEL}) is downloaded on first use",
    )
    g.add_argument(
        "--emotion",
        type=float,
        nargs=8,
        default=None,
        metavar="W",
        help="8 weights: happiness sadness disgust fear surprise anger other neutral (divided by their sum; "
        f"default {' '.join(str(w) for w in DEFAULT_EMOTION)})",
    )
    g.add_argument("--pitch-std", type=float, default=20.0, help="pitch variation, 0-400 (20-45 normal, 60-150 lively)")
    g.add_argument("--speaking-rate", type=float, default=15.0, help="speaking rate, 0-40 (10 slow, 30 very fast)")
    g.add_argument("--fmax", type=float, default=22050.0, help="maximum frequency in Hz, 0-24000")
    g.add_argument(
        "--unconditional",
        action="append",
        default=None,
        metavar="KEY",
        help="use the model's learned unconditional value for this conditioning key (repeatable): speaker, "
        "emotion, vqscore_8, fmax, pitch_std, speaking_rate, dnsmos_ovrl (default: vqscore_8 and dnsmos_ovrl)",
    )


def _speak_parser(prog: str, default_out: str) -> argparse.ArgumentParser:
    from zonos.conditioning.segments import DEFAULT_MAX_CHARS

    p = _Parser(
        prog=prog,
        description="Speak text into an audio file (wav, flac or ogg by its extension, 44.1 kHz mono) or to stdout.",
        formatter_class=_formatter(),
    )
    p.add_argument("text", nargs="?", default=None, help="the text to speak; '-' reads it from standard input")
    p.add_argument(
        "--text", dest="text_option", default=None, metavar="TEXT", help="the text, as an option (same as TEXT)"
    )
    p.add_argument("-f", "--file", default=None, help="read the text from this UTF-8 file ('-': standard input)")
    p.add_argument(
        "-o", "--out", default=default_out, help="output file (.wav, .flac or .ogg), or '-' for a wav on stdout"
    )
    p.add_argument(
        "--sample-format",
        choices=("pcm16", "float"),
        default=None,
        help="sample format of .wav output: 16-bit integers or 32-bit float (default pcm16; .flac is pcm16 only, "
        ".ogg is Vorbis)",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="write the audio chunk by chunk as frames complete and report the time to first audio",
    )
    p.add_argument(
        "--max-segment-chars",
        type=int,
        default=DEFAULT_MAX_CHARS,
        help="longer text is split at sentence ends (then commas, then words) into segments of at most this many "
        "characters (a CJK character counts 3), each one generation",
    )
    _add_voice_args(p)
    _add_generation_args(p)
    _add_sampling_args(p)
    _add_model_args(p)
    return p


def _voice_parser(prog: str) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Turn a voice clip into a speaker-embedding file for `zonos-tts speak --voice FILE`.",
        formatter_class=_formatter(),
    )
    p.add_argument("clip", help="the voice clip (wav/flac/ogg; several seconds of one speaker's clean speech)")
    p.add_argument("-o", "--out", default=None, help="the voice file to write (default: CLIP's name with .pt)")
    p.add_argument(
        "--speaker-model",
        default=DEFAULT_SPEAKER_MODEL,
        help="the speaker-embedding model: Hugging Face repo id or a local directory holding its two .pt files",
    )
    p.add_argument("--device", default=None, help="torch device, e.g. cuda or cpu (default: cuda if available)")
    return p


def _bench_parser(prog: str) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Measure time to first audio, real-time factor and decode step time on this machine, with the "
        "accelerator flags given, and print them as a table.",
        formatter_class=_formatter(),
    )
    p.add_argument("--text", default=BENCH_TEXT, help="the text to speak")
    p.add_argument("--runs", type=int, default=5, help="timed streamed requests (the table shows median, min, max)")
    _add_generation_args(p)
    p.set_defaults(max_new_tokens=86 * 10)
    _add_model_args(p)
    return p


_COMMANDS = {
    "speak": "speak text into an audio file or stdout",
    "voice": "turn a voice clip into a speaker-embedding file",
    "bench": "measure time to first audio, real-time factor and step time here",
    "demo": "serve the streaming web demo (arguments go to gradio_interface; see `zonos-tts demo --help`)",
    "serve": "serve OpenAI-compatible streaming speech over HTTP (needs the server extra)",
}


def _top_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="zonos-tts",
        description="Zonos text-to-speech, accelerated and streaming. `zonos-tts COMMAND --help` lists each "
        "command's flags.",
    )
    p.add_argument("--version", action="version", version=f"zonos-tts {__version__}", help="print the version")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in _COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return p


# ----------------------------------------------------------------------------------------- validation


@dataclass
class _Output:
    """Where audio goes: a file path (container, subtype) or stdout ("-", always wav)."""

    path: Path | None
    container: str
    subtype: str


def _check_output(out: str, sample_format: str | None) -> _Output:
    if out == "-":
        if sys.stdout is None or sys.stdout.isatty():
            raise UsageError(
                "--out -: standard output is a terminal; redirect it (> file.wav, | player) or give a file"
            )
        return _Output(None, "WAV", "FLOAT" if sample_format == "float" else "PCM_16")
    path = Path(out).expanduser()
    _check_writable(path, "--out")
    container = CONTAINERS.get(path.suffix.lower())
    if container is None:
        raise UsageError(f"--out {out}: unknown audio format {path.suffix or '(none)'!r}; name it .wav, .flac or .ogg")
    if container == "FLAC" and sample_format == "float":
        raise UsageError(f"--out {out}: FLAC stores integer samples; use --sample-format pcm16, or a .wav name")
    if container == "OGG" and sample_format is not None:
        raise UsageError(f"--out {out}: .ogg is Vorbis, which has no sample format; drop --sample-format")
    subtype = {"OGG": "VORBIS"}.get(container, "FLOAT" if sample_format == "float" else "PCM_16")
    return _Output(path, container, subtype)


def _check_writable(path: Path, flag: str) -> None:
    parent = path.parent
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: the directory {parent} does not exist; create it first (mkdir -p {parent})")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot write into {parent} (permission denied); pick another directory")


def _read_text(args: argparse.Namespace, default_text: str | None) -> str:
    given = [(f, v) for f, v in (("TEXT", args.text), ("--text", args.text_option), ("-f", args.file)) if v is not None]
    if len(given) > 1:
        raise UsageError(f"the text is given twice ({' and '.join(f for f, _ in given)}); give it once")
    if not given:
        if default_text is None:
            raise UsageError("no text: give it as an argument, '-' to read standard input, or -f FILE")
        return default_text
    flag, value = given[0]
    if value == "-":
        if sys.stdin is None:
            raise UsageError(f"{flag} -: there is no standard input to read the text from")
        text = sys.stdin.read()
    elif flag == "-f":
        try:
            text = Path(value).expanduser().read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"-f {value}: no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"-f {value}: cannot read it as UTF-8 text ({e})") from None
    else:
        text = value
    if not text.strip():
        where = {"TEXT": "the text", "--text": "--text"}.get(flag, f"{flag} {value}")
        raise UsageError(f"{where} is empty: give the words to speak")
    return text


def _check_model_source(name: str, flag: str, files: Sequence[str]) -> None:
    """A local directory must hold ``files``; anything else must look like a Hub repo id."""
    path = Path(name).expanduser()
    if path.is_dir():
        missing = [f for f in files if not (path / f).is_file()]
        if missing:
            raise UsageError(f"{flag} {name}: the directory has no {' or '.join(missing)}")
        return
    if path.exists():
        raise UsageError(f"{flag} {name}: is a file; give a directory holding {' and '.join(files)}, or a repo id")
    if name.startswith((".", "/", "~")) or name.count("/") != 1 or not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        raise UsageError(
            f"{flag} {name}: no such directory, and not a Hugging Face repo id (namespace/name, e.g. {DEFAULT_MODEL})"
        )


def _check_device(spec: str | None, args: argparse.Namespace | None = None):
    import torch

    from zonos.utils import default_device
    from zonos.validation import check_device

    try:
        device = check_device("--device", spec) if spec else default_device()
    except ValueError as e:
        raise UsageError(str(e)) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                f"--device {spec}: torch sees no CUDA device here; use --device cpu (or a CUDA build of torch)"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {spec}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    for flag in ("cute_gemv", "cute_scan"):
        if args is None or not getattr(args, flag, False):
            continue
        option = "--" + flag.replace("_", "-")
        if device.type != "cuda":
            raise UsageError(f"{option} runs CUDA kernels and the model would be on {device}: drop it, or use a GPU")
        if importlib.util.find_spec("cutlass") is None:
            raise UsageError(f"{option} needs nvidia-cutlass-dsl: pip install 'zonos-accel[gpu]', or drop {option}")
    return device


def _check_positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def _check_generation(args: argparse.Namespace) -> None:
    from zonos.conditioning import normalize_language

    try:
        args.language = normalize_language(args.language)
    except ValueError as e:
        raise UsageError(f"--language: {e}") from None
    _check_positive(args, "max_new_tokens", "first_chunk_frames", "chunk_frames")
    if args.max_new_tokens > MAX_SEQLEN - 9 - 1:
        raise UsageError(
            f"--max-new-tokens {args.max_new_tokens}: the model has {MAX_SEQLEN} positions for the text, the frames "
            "and 9 more; longer text is split into segments by itself, so keep it at most 2580 (30 s)"
        )
    from zonos.validation import MAX_CFG_SCALE

    if not math.isfinite(args.cfg_scale) or not 0 < args.cfg_scale <= MAX_CFG_SCALE:
        raise UsageError(
            f"--cfg-scale must be a positive number up to {MAX_CFG_SCALE:g} (1.0 disables guidance), got "
            f"{args.cfg_scale}"
        )
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise UsageError(f"--seed must be a non-negative integer below 2**63, got {args.seed}")
    if not getattr(args, "stream", True):
        for name in ("first_chunk_frames", "chunk_frames"):
            if getattr(args, name) is not None:
                raise UsageError(f"--{name.replace('_', '-')} applies only to streaming: add --stream")


def _sampling_params(args: argparse.Namespace) -> dict[str, float]:
    from zonos.sampling import SamplingParams

    names = ("min_p", "temperature", "top_p", "top_k", "linear", "conf", "quad")
    names += ("repetition_penalty", "repetition_penalty_window")
    params = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    for name, value in params.items():
        if not math.isfinite(value):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    try:
        SamplingParams.from_dict(params)
    except ValueError as e:
        raise UsageError(f"sampling: {e}") from None
    return params


def _check_style(args: argparse.Namespace) -> dict[str, Any]:
    """make_cond_dict's keyword arguments other than text, speaker and device."""
    from zonos.conditioning import COND_KEYS

    for flag, value, top in (
        ("--pitch-std", args.pitch_std, 400),
        ("--speaking-rate", args.speaking_rate, 40),
        ("--fmax", args.fmax, 24000),
    ):
        if not (math.isfinite(value) and 0 <= value <= top):
            raise UsageError(f"{flag} must lie in 0..{top}, got {value}")
    cond: dict[str, Any] = dict(
        language=args.language, pitch_std=args.pitch_std, speaking_rate=args.speaking_rate, fmax=args.fmax
    )
    if args.emotion is not None:
        if not all(math.isfinite(w) and w >= 0 for w in args.emotion) or sum(args.emotion) <= 0:
            raise UsageError(f"--emotion takes 8 non-negative weights, not all zero; got {args.emotion}")
        cond["emotion"] = list(args.emotion)
    if args.unconditional is not None:
        bad = sorted(set(args.unconditional) - set(COND_KEYS[1:]))
        if bad:
            raise UsageError(f"--unconditional {' '.join(bad)}: unknown key; choose from {', '.join(COND_KEYS[1:])}")
        cond["unconditional_keys"] = set(args.unconditional)
    return cond


def _check_clip(path: str, flag: str) -> None:
    import soundfile as sf

    from zonos.audio import check_sample_rate
    from zonos.speaker import MIN_SECONDS

    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"{flag} {path}: no such file")
    try:
        info = sf.info(str(p))
    except Exception as e:  # libsndfile raises several types for unreadable files
        raise UsageError(f"{flag} {path}: not a readable audio file ({e}); convert it to wav or flac") from None
    try:
        check_sample_rate(info.samplerate, f"{flag} {path}: sample rate")
    except ValueError as e:
        raise UsageError(str(e)) from None
    if info.frames < MIN_SECONDS * info.samplerate:
        raise UsageError(
            f"{flag} {path}: {info.frames / info.samplerate:.2f} s is too short; the voice needs at least "
            f"{MIN_SECONDS} s of speech (several seconds work best)"
        )


def _check_phonemes(segments: Sequence[str], language: str) -> None:
    """Phonemize every segment now: a missing eSpeak, a voice it lacks or a missing Japanese extra is found
    before the model loads (the phonemes are cached, so conditioning does not redo the work)."""
    from zonos.conditioning import EspeakNotFoundError, MissingDependencyError, phonemize
    from zonos.conditioning.phonemes import check_phonemes

    try:
        for text, phonemes in zip(segments, phonemize(list(segments), [language] * len(segments))):
            check_phonemes(text, language, phonemes)
    except (EspeakNotFoundError, MissingDependencyError, ValueError) as e:
        raise UsageError(f"text to phonemes ({language}): {e}") from None


def load_voice(path: str | os.PathLike):
    """The (1, 1, 128) speaker embedding in a voice file from ``zonos-tts voice`` (or in a plain tensor of 128
    values saved with ``torch.save``). Raises :class:`UsageError` saying what the file is instead."""
    import torch

    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"--voice {path}: no such file")
    with p.open("rb") as f:
        head = f.read(4)
    if head.startswith(_AUDIO_MAGIC):
        raise UsageError(
            f"--voice {path}: is an audio clip, not a voice file; pass it as --speaker-audio, or make a voice file "
            f"with `zonos-tts voice {path}`"
        )
    try:
        data = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception:  # unpickling and zip errors come as several types, with long messages
        raise UsageError(
            f"--voice {path}: torch.load cannot read it; not a voice file from `zonos-tts voice`"
        ) from None
    if isinstance(data, dict):
        if data.get("format") != VOICE_FORMAT:
            raise UsageError(
                f"--voice {path}: a dict without the {VOICE_FORMAT!r} marker; make it with `zonos-tts voice`"
            )
        if data.get("version", 0) > VOICE_VERSION:
            raise UsageError(f"--voice {path}: voice file version {data['version']} is newer than this zonos-tts")
        data = data.get("embedding")
    if not isinstance(data, torch.Tensor) or data.numel() != 128 or not data.is_floating_point():
        raise UsageError(f"--voice {path}: holds no 128-value speaker embedding; make it with `zonos-tts voice`")
    if not bool(torch.isfinite(data.float()).all()):
        raise UsageError(f"--voice {path}: the embedding has NaN or infinite values; make it again")
    return data.reshape(1, 1, 128)


def save_voice(path: str | os.PathLike, embedding, **info: Any) -> None:
    """Write ``embedding`` as a voice file (a dict with the :data:`VOICE_FORMAT` marker), atomically."""
    import torch

    record = {"format": VOICE_FORMAT, "version": VOICE_VERSION, "embedding": embedding.detach().cpu(), **info}
    with _atomic_path(Path(path)) as tmp:
        torch.save(record, str(tmp))


# ---------------------------------------------------------------------------------------------- output


def _temp_beside(path: Path) -> Path:
    """A new empty file in ``path``'s directory (so the final rename stays on one file system)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the result private
    return Path(tmp)


@contextmanager
def _atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` that replaces it when the block succeeds and is removed otherwise."""
    tmp = _temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def wav_header(sample_rate: int, subtype: str, frames: int | None = None) -> bytes:
    """A mono RIFF/WAVE header for PCM_16 or FLOAT samples; ``frames=None`` marks the length unknown (a stream)."""
    tag, width = (1, 2) if subtype == "PCM_16" else (3, 4)
    data = 0xFFFFFFFF if frames is None else frames * width
    riff = 0xFFFFFFFF if frames is None else 36 + data
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        *(b"RIFF", riff, b"WAVE", b"fmt ", 16, tag, 1, sample_rate, sample_rate * width, width, 8 * width),
        *(b"data", data),
    )


def _wav_data(audio, subtype: str) -> bytes:
    """float32 samples as the bytes of a little-endian WAV data chunk of ``subtype``, converted by libsndfile
    (headerless RAW into memory), so stdout holds exactly the samples a file of that subtype would."""
    import soundfile as sf

    buffer = io.BytesIO()
    with sf.SoundFile(buffer, "w", 44100, 1, subtype, endian="LITTLE", format="RAW") as f:
        f.write(audio)
    return buffer.getvalue()


class _Writer:
    """Appends float32 mono audio to an open output and counts the samples written."""

    def __init__(self, put: Callable[[Any], None]):
        self._put, self.samples = put, 0

    def write(self, audio) -> None:
        import numpy as np

        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        self._put(audio)
        self.samples += audio.size


@contextmanager
def _sink(out: _Output, sample_rate: int, stdout: BinaryIO | None, frames: int | None = None) -> Iterator[_Writer]:
    """A writer to ``out``: a WAV stream on ``stdout``, or a temp file that replaces ``out.path`` at the end of
    the block (removed instead when the block fails). Every write is flushed, so readers see the audio so far."""
    if out.path is None:
        stdout.write(wav_header(sample_rate, out.subtype, frames))

        def put(audio) -> None:
            stdout.write(_wav_data(audio, out.subtype))
            stdout.flush()

        yield _Writer(put)
        stdout.flush()
        return
    import numpy as np
    import soundfile as sf

    with _atomic_path(out.path) as tmp:
        with sf.SoundFile(str(tmp), "w", sample_rate, 1, out.subtype, format=out.container) as f:

            def put(audio) -> None:
                if out.subtype != "FLOAT":
                    audio = np.clip(audio, -1.0, 1.0)  # libsndfile does not clip: out-of-range samples would wrap
                f.write(audio)
                f.flush()

            yield _Writer(put)


# ----------------------------------------------------------------------------------------------- model


def load_model(args: argparse.Namespace, device):
    """The Zonos model and codec named by ``args`` on ``device``, with the accelerator flags applied."""
    from zonos.codec import DACAutoencoder
    from zonos.model import Zonos

    t0 = time.perf_counter()
    codec = DACAutoencoder.from_pretrained(args.codec, device=device)
    model = Zonos.from_pretrained(
        args.model,
        device=device,
        autoencoder=codec,
        fast_ops=False if args.no_fast_ops else None,
        cuda_graphs=False if args.no_cuda_graphs else None,
        use_cute_gemv=args.cute_gemv,
        use_cute_scan=getattr(args, "cute_scan", False),
        fused_sampling=False if getattr(args, "no_fused_sampling", False) else None,
    )
    _log(f"loaded {args.model} on {device} in {time.perf_counter() - t0:.1f} s")
    return model


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _error(message: object) -> None:
    """Print ``error: message`` on one line (a multi-line message is joined)."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    _log(f"error: {' '.join(lines)}")


def _generator(seed: int | None, device):
    import torch

    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


def _schedule(args: argparse.Namespace) -> dict[str, int]:
    return {k: getattr(args, k) for k in ("first_chunk_frames", "chunk_frames") if getattr(args, k) is not None}


def _warmup(model, prefix_length: int, args: argparse.Namespace, sampling: dict) -> None:
    if model.device.type != "cuda" or args.no_warmup:
        return
    seconds = model.warmup(
        prefix_length=prefix_length,
        cfg_scale=args.cfg_scale,
        sampling_params=sampling,
        progress_bar=not args.no_progress,
        **_schedule(args),
    )
    _log(f"warmed up in {seconds:.1f} s")


# ----------------------------------------------------------------------------------------------- speak


@dataclass
class _Timer:
    start: float = field(default_factory=time.perf_counter)
    generating: float | None = None  # when the first generate call started (after its conditioning)
    first_audio: float | None = None

    def audio(self, samples: int) -> None:
        if self.first_audio is None and samples:
            self.first_audio = time.perf_counter()
            total = 1000 * (self.first_audio - self.start)
            if self.generating is None:
                _log(f"time to first audio: {total:.0f} ms (conditioning included)")
            else:
                after = 1000 * (self.first_audio - self.generating)
                _log(f"time to first audio: {after:.0f} ms after conditioning ({total:.0f} ms including it)")


def _longform() -> Callable | None:
    """``zonos.longform.speak_segments`` when that module exists."""
    try:
        module = importlib.import_module("zonos.longform")
    except ModuleNotFoundError as e:
        if e.name != "zonos.longform":
            raise
        return None
    return getattr(module, "speak_segments", None)


def _segment_audio(model, segments: Sequence[str], cond: dict, gen: dict, stream: bool, timer: _Timer) -> Iterator:
    """Audio pieces (numpy float32) of ``segments`` in order: streamed chunks, or one piece per segment."""
    from zonos.conditioning import make_cond_dict

    speak_segments = _longform() if len(segments) > 1 else None
    if speak_segments is not None:
        result = speak_segments(model, list(segments), cond=cond, stream=stream, **gen)
        if stream:
            for chunk in result:
                yield chunk.audio[0, 0].cpu().numpy()
        else:
            yield model.autoencoder.decode(result)[0, 0].cpu().numpy()
        return
    for i, text in enumerate(segments):
        prefix = model.prepare_conditioning(make_cond_dict(text=text, **cond))
        if timer.generating is None:
            timer.generating = time.perf_counter()
        frames = 0
        if stream:
            for chunk in model.generate(prefix, stream=True, **gen):
                frames = chunk.frames[1]
                yield chunk.audio[0, 0].cpu().numpy()
        else:
            kwargs = {k: v for k, v in gen.items() if k not in ("first_chunk_frames", "chunk_frames")}
            codes = model.generate(prefix, **kwargs)
            frames = codes.shape[-1]
            yield model.autoencoder.decode(codes)[0, 0].cpu().numpy()
        if frames >= gen["max_new_tokens"]:
            where = f"segment {i + 1} of {len(segments)}" if len(segments) > 1 else "the text"
            _log(
                f"warning: {where} reached --max-new-tokens ({frames} frames, {frames / FRAMES_PER_SECOND:.1f} s) "
                "before the model ended it, so its audio may stop early; raise --max-new-tokens or lower "
                "--max-segment-chars"
            )


def speak_main(
    argv: Sequence[str] | None = None,
    prog: str = "zonos-tts speak",
    default_text: str | None = None,
    default_out: str = "speech.wav",
) -> int:
    """``zonos-tts speak``: returns the exit status (0, or 2 for a bad input)."""
    parser = _speak_parser(prog, default_out)
    args = parser.parse_args(argv)
    try:
        plan = _plan_speak(args, default_text)
    except UsageError as e:
        _error(e)
        return 2
    return _run(lambda: _speak(args, *plan))


def _plan_speak(args: argparse.Namespace, default_text: str | None):
    from zonos.conditioning.segments import split_text

    out = _check_output(args.out, args.sample_format)
    text = _read_text(args, default_text)
    _check_positive(args, "max_segment_chars")
    _check_generation(args)
    style = _check_style(args)
    sampling = _sampling_params(args)
    if args.voice and args.speaker_audio:
        raise UsageError("give either --voice or --speaker-audio, not both")
    voice = load_voice(args.voice) if args.voice else None
    if args.speaker_audio:
        _check_clip(args.speaker_audio, "--speaker-audio")
    _check_model_source(args.model, "--model", ("config.json", "model.safetensors"))
    _check_model_source(args.codec, "--codec", ("config.json", "model.safetensors"))
    device = _check_device(args.device, args)
    segments = split_text(text, args.max_segment_chars)
    _check_phonemes(segments, args.language)
    return out, segments, style, sampling, voice, device


def _speak(args, out: _Output, segments: list[str], style: dict, sampling: dict, voice, device) -> int:
    from zonos.audio import load_audio
    from zonos.conditioning import make_cond_dict
    from zonos.speaker import MAX_SECONDS

    stdout = sys.stdout.buffer if out.path is None else None
    with redirect_stdout(sys.stderr):  # stray prints must not mix with audio on stdout
        model = load_model(args, device)
        speaker = voice
        if args.speaker_audio:
            speaker = model.make_speaker_embedding(*load_audio(args.speaker_audio, max_seconds=MAX_SECONDS))
        cond = dict(style, speaker=speaker, device=device)
        gen = dict(
            max_new_tokens=args.max_new_tokens,
            cfg_scale=args.cfg_scale,
            sampling_params=sampling,
            progress_bar=not args.no_progress,
            generator=_generator(args.seed, device),
        )
        if len(segments) > 1:
            _log(f"speaking {len(segments)} segments of at most {args.max_segment_chars} characters")
        sr = model.autoencoder.sampling_rate
        if args.stream:
            gen.update(_schedule(args))
            if model.device.type == "cuda" and not args.no_warmup:
                first = model.prepare_conditioning(make_cond_dict(text=segments[0], **cond))
                _warmup(model, first.shape[1], args, sampling)
            timer = _Timer()
            with _sink(out, sr, stdout) as sink:
                for audio in _segment_audio(model, segments, cond, gen, True, timer):
                    sink.write(audio)
                    timer.audio(sink.samples)
            samples = sink.samples
        else:
            import numpy as np

            timer = _Timer()
            audio = np.concatenate(list(_segment_audio(model, segments, cond, gen, False, timer)))
            with _sink(out, sr, stdout, frames=audio.size) as sink:
                sink.write(audio)
            samples = audio.size
    elapsed = time.perf_counter() - timer.start
    seconds = samples / sr
    where = "stdout" if out.path is None else str(out.path)
    _log(f"wrote {where}: {seconds:.2f} s of audio in {elapsed:.2f} s (real-time factor {seconds / elapsed:.2f}x)")
    return 0


def _run(work: Callable[[], int]) -> int:
    """Run ``work``, turning input errors into one ``error:`` line and status 2."""
    try:
        return work()
    except (UsageError, ValueError, FileNotFoundError) as e:  # ZonosInputError / CheckpointError are ValueErrors
        _error(e)
        return 2
    except BrokenPipeError:
        sys.stderr.write("error: the reader of standard output went away\n")
        return 1
    except KeyboardInterrupt:
        _log("interrupted (an output file is written only when speech is complete)")
        return 130


# ----------------------------------------------------------------------------------------------- voice


def voice_main(argv: Sequence[str] | None = None, prog: str = "zonos-tts voice") -> int:
    """``zonos-tts voice``: embed a clip's voice and save it for ``speak --voice``."""
    args = _voice_parser(prog).parse_args(argv)
    try:
        _check_clip(args.clip, "CLIP")
        out = Path(args.out if args.out else Path(args.clip).with_suffix(".pt").name).expanduser()
        if out.suffix.lower() in CONTAINERS:
            raise UsageError(f"--out {out}: would overwrite audio with a voice file; name it .pt")
        _check_writable(out, "--out")
        _check_model_source(args.speaker_model, "--speaker-model", ("ResNet293_SimAM_ASP_base.pt",))
        device = _check_device(args.device)
    except UsageError as e:
        _error(e)
        return 2
    return _run(lambda: _voice(args, out, device))


def _voice(args: argparse.Namespace, out: Path, device) -> int:
    from zonos.audio import load_audio
    from zonos.speaker import MAX_SECONDS, SpeakerEmbedding, check_speaker_clip

    t0 = time.perf_counter()
    wav, sr = check_speaker_clip(*load_audio(args.clip, max_seconds=MAX_SECONDS))  # before the model loads
    speaker = SpeakerEmbedding.from_pretrained(args.speaker_model, device=device)
    embedding = speaker.embed(wav, sr)
    save_voice(out, embedding, clip=Path(args.clip).name, seconds=wav.shape[-1] / sr, speaker_model=args.speaker_model)
    _log(f"wrote {out} in {time.perf_counter() - t0:.1f} s: use it with `zonos-tts speak --voice {out} ...`")
    return 0


# ----------------------------------------------------------------------------------------------- bench


def bench_main(argv: Sequence[str] | None = None, prog: str = "zonos-tts bench") -> int:
    """``zonos-tts bench``: time streamed and one-shot requests and print a table on stdout."""
    args = _bench_parser(prog).parse_args(argv)
    args.stream = True  # chunk sizes apply: bench streams
    try:
        if not args.text.strip():
            raise UsageError("--text is empty: give the words to speak")
        _check_positive(args, "runs")
        _check_generation(args)
        _check_model_source(args.model, "--model", ("config.json", "model.safetensors"))
        _check_model_source(args.codec, "--codec", ("config.json", "model.safetensors"))
        device = _check_device(args.device, args)
        _check_phonemes([args.text], args.language)
    except UsageError as e:
        _error(e)
        return 2
    return _run(lambda: _bench(args, device))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bench(args: argparse.Namespace, device) -> int:
    import statistics

    from zonos.conditioning import make_cond_dict

    model = load_model(args, device)
    sr = model.autoencoder.sampling_rate
    sampling = {"min_p": 0.1}
    gen = dict(
        max_new_tokens=args.max_new_tokens, cfg_scale=args.cfg_scale, sampling_params=sampling, progress_bar=False
    )
    cond = make_cond_dict(text=args.text, language=args.language, device=device)
    t0 = time.perf_counter()
    prefix = model.prepare_conditioning(cond)
    _sync(device)
    conditioning_ms = 1000 * (time.perf_counter() - t0)
    _warmup(model, prefix.shape[1], args, sampling)
    seed = 0 if args.seed is None else args.seed

    ttfa, stream_rtf = [], []
    for run in range(args.runs):
        generator = _generator(seed + run, device)
        t0 = time.perf_counter()
        first = None
        samples = 0
        for chunk in model.generate(prefix, stream=True, generator=generator, **gen, **_schedule(args)):
            samples += chunk.audio.shape[-1]
            if first is None and samples:
                first = time.perf_counter() - t0
        elapsed = time.perf_counter() - t0
        ttfa.append(1000 * (first if first is not None else elapsed))
        stream_rtf.append(samples / sr / elapsed)

    stamps: list[float] = []

    def on_step(frame, step: int, max_steps: int) -> bool:
        stamps.append(time.perf_counter())
        return True

    t0 = time.perf_counter()
    codes = model.generate(prefix, generator=_generator(seed, device), callback=on_step, **gen)
    _sync(device)
    t_codes = time.perf_counter()
    wav = model.autoencoder.decode(codes)
    _sync(device)
    one_shot = wav.shape[-1] / sr / (time.perf_counter() - t0)
    step_ms = 1000 * (t_codes - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")

    flags = (
        f"fast_ops={'off' if args.no_fast_ops else 'default'} "
        f"cuda_graphs={'off' if args.no_cuda_graphs else 'default'} cute_gemv={'on' if args.cute_gemv else 'off'}"
    )
    name = device.type
    if device.type == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
    rows = [
        ("time to first audio (ms)", ttfa),
        ("real-time factor, streamed (x)", stream_rtf),
        ("real-time factor, one-shot (x)", [one_shot]),
        ("decode step (ms)", [step_ms]),
        ("conditioning (ms)", [conditioning_ms]),
    ]
    print(f"zonos-tts bench: {args.model} on {name} ({model.dtype}), {flags}")
    print(
        f"{args.runs} streamed run(s), {codes.shape[-1]} frames one-shot ({codes.shape[-1] / FRAMES_PER_SECOND:.1f} s)"
    )
    print(f"| {'measure':<32} | {'median':>9} | {'min':>9} | {'max':>9} |")
    print(f"|{'-' * 34}|{'-' * 11}|{'-' * 11}|{'-' * 11}|")
    for label, values in rows:
        cells = (statistics.median(values), min(values), max(values))
        print(f"| {label:<32} | " + " | ".join(f"{v:>9.2f}" for v in cells) + " |")
    sys.stdout.flush()
    return 0


# ------------------------------------------------------------------------------------------------ demo


def demo_main(argv: Sequence[str] | None = None) -> int:
    """``zonos-tts demo``: the Gradio demo's own command line (``gradio_interface.main``)."""
    try:
        demo = importlib.import_module("gradio_interface")
    except ModuleNotFoundError as e:
        if e.name != "gradio_interface":
            raise
        _log("error: the demo (gradio_interface.py) is not installed here; run it from a checkout of the repository")
        return 2
    return demo.main(list(argv or []))


def _serve_main(argv: Sequence[str] | None = None, prog: str = "zonos-tts serve") -> int:
    """``zonos-tts serve``: the speech server (:mod:`zonos.serve.command`)."""
    from zonos.serve.command import serve_main

    return serve_main(argv, prog)


# ------------------------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    """The ``zonos-tts`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"speak": speak_main, "voice": voice_main, "bench": bench_main, "demo": demo_main, "serve": _serve_main}
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:]) if argv[0] == "demo" else commands[argv[0]](argv[1:], f"zonos-tts {argv[0]}")
    _top_parser().parse_args(argv)  # prints help, the version, or an error for an unknown command
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
