"""The generation flags and checks that ``speak`` and ``bench`` share, and the helpers that turn them into
``Zonos.generate`` arguments."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from zonos.cli.common import UsageError, check_positive, log

MAX_SEQLEN = 4096  # the published models' positions: prefix + frames + 9 delay steps must fit


FRAMES_PER_SECOND = 44100 / 512


def add_generation_args(p: argparse.ArgumentParser) -> None:
    """Language, seed, guidance, frame budget and chunk-schedule flags."""
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


def check_generation(args: argparse.Namespace) -> None:
    """Check :func:`add_generation_args`' flags (normalizing ``args.language``); raises :class:`UsageError`."""
    from zonos.conditioning import normalize_language

    try:
        args.language = normalize_language(args.language)
    except ValueError as e:
        raise UsageError(f"--language: {e}") from None
    check_positive(args, "max_new_tokens", "first_chunk_frames", "chunk_frames")
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


def check_phonemes(segments: Sequence[str], language: str) -> None:
    """Phonemize every segment now: a missing eSpeak, a voice it lacks or a missing Japanese extra is found
    before the model loads (the phonemes are cached, so conditioning does not redo the work)."""
    from zonos.conditioning import EspeakNotFoundError, MissingDependencyError, phonemize
    from zonos.conditioning.phonemes import check_phonemes

    try:
        for text, phonemes in zip(segments, phonemize(list(segments), [language] * len(segments))):
            check_phonemes(text, language, phonemes)
    except (EspeakNotFoundError, MissingDependencyError, ValueError) as e:
        raise UsageError(f"text to phonemes ({language}): {e}") from None


def make_generator(seed: int | None, device):
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (None: no generator, each run differs)."""
    import torch

    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


def chunk_schedule(args: argparse.Namespace) -> dict[str, int]:
    """The chunk sizes given on the command line, as ``generate`` keywords."""
    return {k: getattr(args, k) for k in ("first_chunk_frames", "chunk_frames") if getattr(args, k) is not None}


def warmup(model, prefix_length: int, args: argparse.Namespace, sampling: dict) -> None:
    """On CUDA (unless ``--no-warmup``): compile kernels and capture graphs before the timed request."""
    if model.device.type != "cuda" or args.no_warmup:
        return
    seconds = model.warmup(
        prefix_length=prefix_length,
        cfg_scale=args.cfg_scale,
        sampling_params=sampling,
        progress_bar=not args.no_progress,
        **chunk_schedule(args),
    )
    log(f"warmed up in {seconds:.1f} s")
