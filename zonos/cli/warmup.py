"""``zonos-tts warmup``: compile every GPU kernel the model runs into the kernel cache
(:mod:`zonos_accel.kernel_cache`) now, so that later processes on this machine (``speak``, ``serve``, the demo)
load them from disk instead of compiling before their first audio. Meant for a machine's (or an image's) setup
step; it also downloads the model and codec when they are Hub repo ids."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from zonos.cli.common import (
    Parser,
    UsageError,
    add_model_args,
    check_device,
    check_model_source,
    check_positive,
    error,
    help_formatter,
    load_model,
    log,
    run_command,
)

__all__ = ["build_parser", "warmup_main"]


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The ``warmup`` parser."""
    p = Parser(
        prog=prog,
        description="Compile the model's Triton and CuTeDSL kernels into the kernel cache now (one-time, about a "
        "minute on a fresh machine), so that later runs here start without compiling. Pass the accelerator flags "
        "later runs will use (e.g. --cute-gemv): each compiles its own kernels.",
        formatter_class=help_formatter(),
    )
    p.add_argument(
        "--streams",
        type=int,
        default=1,
        help="also run 2, 4, ... 32, then every 32 up to this many requests at once, compiling the kernels of "
        "every bucket of busy slots up to there (a server's --slots)",
    )
    p.add_argument(
        "--cfg-scale",
        type=float,
        default=2.0,
        help="the classifier-free guidance scale later requests use (1.0 runs unguided kernels)",
    )
    p.add_argument(
        "--min-p",
        type=float,
        default=0.1,
        help="the min-p threshold later requests use (0: the sampler without min-p, which the server's own warm-up "
        "compiles)",
    )
    p.add_argument(
        "--compile-processes",
        type=int,
        default=0,
        help="compile the Triton kernels in this many processes (no shared interpreter lock) instead of on a "
        "thread per core (0)",
    )
    add_model_args(p)
    return p


def warmup_main(argv: Sequence[str] | None = None, prog: str = "zonos-tts warmup") -> int:
    """``zonos-tts warmup``: fill the kernel cache; returns the exit status."""
    from zonos_accel.kernel_cache import kernel_cache_dirs, use_kernel_cache

    args = build_parser(prog).parse_args(argv)
    try:
        check_positive(args, "streams")
        if args.compile_processes < 0:
            raise UsageError(f"--compile-processes {args.compile_processes}: must be 0 or more")
        if not 0 <= args.min_p <= 1:
            raise UsageError(f"--min-p {args.min_p}: must be in [0, 1]")
        check_model_source(args.model, "--model", ("config.json", "model.safetensors"))
        check_model_source(args.codec, "--codec", ("config.json", "model.safetensors"))
        device = check_device(args.device, args)
        # Before the model loads (an unwritable directory is refused before the download and the load).
        cache = use_kernel_cache(args.kernel_cache) if device.type == "cuda" else kernel_cache_dirs(args.kernel_cache)
    except (UsageError, ValueError) as e:  # ZonosInputError from the kernel cache is a ValueError
        error(e)
        return 2
    return run_command(lambda: _warmup(args, device, cache))


def _warmup(args: argparse.Namespace, device, cache) -> int:
    from zonos.model import DEFAULT_SLOTS

    model = load_model(args, device)
    if device.type != "cuda":
        log(
            f"nothing to compile on {device}: the Triton and CuTeDSL kernels run on CUDA only (on a GPU they would be "
            f"kept in {cache.describe()})"
        )
        return 0
    t0 = time.perf_counter()
    if args.streams > model.engine.slots.count:
        model.start_engine(slots=max(args.streams, DEFAULT_SLOTS))
    model.warmup(
        cfg_scale=args.cfg_scale,
        sampling_params={"min_p": args.min_p},
        streams=args.streams,
        all_prefill_lengths=True,  # prompts of any length later
        progress_bar=not args.no_progress,
        compile_processes=args.compile_processes,
    )
    log(f"warmed up in {time.perf_counter() - t0:.1f} s; the compiled kernels are kept in {cache.describe()}")
    return 0
