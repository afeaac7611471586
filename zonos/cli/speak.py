"""``zonos-tts speak``: text (an argument, standard input or a file) to an audio file or a WAV stream on stdout,
one-shot or streamed; long text is split into segments spoken as one utterance by
:func:`zonos.longform.speak_segments`, and every segment that stops at its frame budget is reported."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zonos.cli.common import (
    DEFAULT_SPEAKER_MODEL,
    Parser,
    UsageError,
    add_model_args,
    check_clip,
    check_device,
    check_model_source,
    check_positive,
    error,
    help_formatter,
    load_model,
    log,
    run_command,
)
from zonos.cli.generation import (
    FRAMES_PER_SECOND,
    add_generation_args,
    check_generation,
    check_phonemes,
    chunk_schedule,
    make_generator,
    warmup,
)
from zonos.cli.output import Output, audio_sink, check_output
from zonos.errors import ZonosInputError

__all__ = ["build_parser", "speak_main"]


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


def build_parser(prog: str, default_out: str) -> argparse.ArgumentParser:
    """The ``speak`` parser; ``default_out`` is ``--out``'s default."""
    from zonos.conditioning.segments import DEFAULT_MAX_CHARS

    p = Parser(
        prog=prog,
        description="Speak text into an audio file (wav, flac or ogg by its extension, 44.1 kHz mono) or to stdout.",
        formatter_class=help_formatter(),
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
    add_generation_args(p)
    _add_sampling_args(p)
    add_model_args(p)
    return p


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
                log(f"time to first audio: {total:.0f} ms (conditioning included)")
            else:
                after = 1000 * (self.first_audio - self.generating)
                log(f"time to first audio: {after:.0f} ms after conditioning ({total:.0f} ms including it)")


def _segment_audio(model, segments: Sequence[str], cond: dict, gen: dict, stream: bool, timer: _Timer) -> Iterator:
    """Audio pieces (numpy float32) of ``segments`` in order: streamed chunks, or one piece for the whole text.
    Every segment gets the frames the model's positions leave it (:func:`zonos.longform.segment_budget`), and one
    that stops there is reported."""
    from zonos.conditioning import make_cond_dict
    from zonos.longform import segment_budget, speak_segments

    gen = dict(gen)
    asked = gen["max_new_tokens"]
    if len(segments) > 1:

        def report(index: int, frames: int, budget: int) -> None:
            _report_limit(f"segment {index + 1} of {len(segments)}", frames, budget, asked)

        result = speak_segments(model, list(segments), cond=cond, stream=stream, on_segment=report, **gen)
        if stream:
            for chunk in result:
                yield chunk.audio[0, 0].cpu().numpy()
        else:
            yield model.autoencoder.decode(result)[0, 0].cpu().numpy()
        return
    prefix = model.prepare_conditioning(make_cond_dict(text=segments[0], **cond))
    gen["max_new_tokens"] = budget = segment_budget(
        model.engine.max_seqlen, prefix.shape[1], max_new_tokens=asked, segment="the text"
    )
    timer.generating = time.perf_counter()
    frames = 0
    if stream:
        for chunk in model.generate(prefix, stream=True, **gen):
            frames = chunk.frames[1]
            yield chunk.audio[0, 0].cpu().numpy()
    else:
        codes = model.generate(prefix, **gen)
        frames = codes.shape[-1]
        yield model.autoencoder.decode(codes)[0, 0].cpu().numpy()
    _report_limit("the text", frames, budget, asked)


def _report_limit(where: str, frames: int, budget: int, asked: int) -> None:
    """Warn when ``where`` took all ``budget`` frames (the model did not end it), naming the flag that helps."""
    if frames < budget:
        return
    if budget < asked:
        limit = "the most frames the model's positions leave it"
        fix = "lower --max-segment-chars"
    else:
        limit = "--max-new-tokens"
        fix = "raise --max-new-tokens or lower --max-segment-chars"
    log(
        f"warning: {where} reached {limit} ({frames} frames, {frames / FRAMES_PER_SECOND:.1f} s) before the model "
        f"ended it, so its audio may stop early; {fix}"
    )


def speak_main(
    argv: Sequence[str] | None = None,
    prog: str = "zonos-tts speak",
    default_text: str | None = None,
    default_out: str = "speech.wav",
) -> int:
    """``zonos-tts speak``: returns the exit status (0; 2 for a bad input; 1 for a failed write)."""
    parser = build_parser(prog, default_out)
    args = parser.parse_args(argv)
    try:
        plan = _plan_speak(args, default_text)
    except (UsageError, ZonosInputError) as e:  # a bad voice file raises the latter
        error(e)
        return 2
    return run_command(lambda: _speak(args, *plan))


def _plan_speak(args: argparse.Namespace, default_text: str | None):
    from zonos.conditioning.segments import split_text

    out = check_output(args.out, args.sample_format)
    text = _read_text(args, default_text)
    check_positive(args, "max_segment_chars")
    check_generation(args)
    style = _check_style(args)
    sampling = _sampling_params(args)
    if args.voice and args.speaker_audio:
        raise UsageError("give either --voice or --speaker-audio, not both")
    if args.voice:
        from zonos.speaker.voices import load_voice

        voice = load_voice(args.voice, "--voice")
    else:
        voice = None
    if args.speaker_audio:
        check_clip(args.speaker_audio, "--speaker-audio")
    check_model_source(args.model, "--model", ("config.json", "model.safetensors"))
    check_model_source(args.codec, "--codec", ("config.json", "model.safetensors"))
    device = check_device(args.device, args)
    segments = split_text(text, args.max_segment_chars)
    check_phonemes(segments, args.language)
    return out, segments, style, sampling, voice, device


def _speak(args, out: Output, segments: list[str], style: dict, sampling: dict, voice, device) -> int:
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
            generator=make_generator(args.seed, device),
        )
        if len(segments) > 1:
            log(f"speaking {len(segments)} segments of at most {args.max_segment_chars} characters")
        sr = model.autoencoder.sampling_rate
        if args.stream:
            gen.update(chunk_schedule(args))
            if model.device.type == "cuda" and not args.no_warmup:
                first = model.prepare_conditioning(make_cond_dict(text=segments[0], **cond))
                warmup(model, first.shape[1], args, sampling)
            timer = _Timer()
            with audio_sink(out, sr, stdout) as sink:
                for audio in _segment_audio(model, segments, cond, gen, True, timer):
                    sink.write(audio)
                    timer.audio(sink.samples)
            samples = sink.samples
        else:
            import numpy as np

            timer = _Timer()
            audio = np.concatenate(list(_segment_audio(model, segments, cond, gen, False, timer)))
            with audio_sink(out, sr, stdout, frames=audio.size) as sink:
                sink.write(audio)
            samples = audio.size
    elapsed = time.perf_counter() - timer.start
    seconds = samples / sr
    where = "stdout" if out.path is None else str(out.path)
    log(f"wrote {where}: {seconds:.2f} s of audio in {elapsed:.2f} s (real-time factor {seconds / elapsed:.2f}x)")
    return 0
