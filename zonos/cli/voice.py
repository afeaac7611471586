"""``zonos-tts voice``: a clip of one speaker to a voice file (:mod:`zonos.speaker.voices`) for
``zonos-tts speak --voice FILE`` and the server's named voices."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from zonos.cli.common import (
    DEFAULT_SPEAKER_MODEL,
    Parser,
    UsageError,
    check_clip,
    check_device,
    check_model_source,
    check_writable,
    error,
    help_formatter,
    log,
    run_command,
)
from zonos.cli.output import CONTAINERS

__all__ = ["build_parser", "voice_main"]


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The ``voice`` parser."""
    p = Parser(
        prog=prog,
        description="Turn a voice clip into a speaker-embedding file for `zonos-tts speak --voice FILE`.",
        formatter_class=help_formatter(),
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


def voice_main(argv: Sequence[str] | None = None, prog: str = "zonos-tts voice") -> int:
    """``zonos-tts voice``: embed a clip's voice and save it for ``speak --voice``."""
    args = build_parser(prog).parse_args(argv)
    try:
        check_clip(args.clip, "CLIP")
        out = Path(args.out if args.out else Path(args.clip).with_suffix(".pt").name).expanduser()
        if out.suffix.lower() in CONTAINERS:
            raise UsageError(f"--out {out}: would overwrite audio with a voice file; name it .pt")
        check_writable(out, "--out")
        check_model_source(args.speaker_model, "--speaker-model", ("ResNet293_SimAM_ASP_base.pt",))
        device = check_device(args.device)
    except UsageError as e:
        error(e)
        return 2
    return run_command(lambda: _voice(args, out, device))


def _voice(args: argparse.Namespace, out: Path, device) -> int:
    from zonos.audio import load_audio
    from zonos.speaker import MAX_SECONDS, SpeakerEmbedding, check_speaker_clip
    from zonos.speaker.voices import save_voice

    t0 = time.perf_counter()
    wav, sr = check_speaker_clip(*load_audio(args.clip, max_seconds=MAX_SECONDS))  # before the model loads
    speaker = SpeakerEmbedding.from_pretrained(args.speaker_model, device=device)
    embedding = speaker.embed(wav, sr)
    save_voice(out, embedding, clip=Path(args.clip).name, seconds=wav.shape[-1] / sr, speaker_model=args.speaker_model)
    log(f"wrote {out} in {time.perf_counter() - t0:.1f} s: use it with `zonos-tts speak --voice {out} ...`")
    return 0
