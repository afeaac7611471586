"""``zonos-tts bench``: time to first audio, real-time factor (streamed and one-shot), decode step and
conditioning time on this machine with the accelerator flags given, printed as a table on stdout."""

from __future__ import annotations

import argparse
import sys
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

__all__ = ["BENCH_TEXT", "bench_main", "build_parser"]

BENCH_TEXT = (
    "The quick brown fox jumps over the lazy dog. A streaming model hands out audio while it is still "
    "generating, so the listener hears the first words almost at once."
)


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The ``bench`` parser."""
    p = Parser(
        prog=prog,
        description="Measure time to first audio, real-time factor and decode step time on this machine, with the "
        "accelerator flags given, and print them as a table.",
        formatter_class=help_formatter(),
    )
    p.add_argument("--text", default=BENCH_TEXT, help="the text to speak")
    p.add_argument("--runs", type=int, default=5, help="timed streamed requests (the table shows median, min, max)")
    add_generation_args(p)
    p.set_defaults(max_new_tokens=86 * 10)
    add_model_args(p)
    return p


def bench_main(argv: Sequence[str] | None = None, prog: str = "zonos-tts bench") -> int:
    """``zonos-tts bench``: time streamed and one-shot requests and print a table on stdout."""
    args = build_parser(prog).parse_args(argv)
    args.stream = True  # chunk sizes apply: bench streams
    try:
        if not args.text.strip():
            raise UsageError("--text is empty: give the words to speak")
        check_positive(args, "runs")
        check_generation(args)
        check_model_source(args.model, "--model", ("config.json", "model.safetensors"))
        check_model_source(args.codec, "--codec", ("config.json", "model.safetensors"))
        device = check_device(args.device, args)
        check_phonemes([args.text], args.language)
    except UsageError as e:
        error(e)
        return 2
    return run_command(lambda: _bench(args, device))


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
    warmup(model, prefix.shape[1], args, sampling)
    seed = 0 if args.seed is None else args.seed

    ttfa, stream_rtf = [], []
    for run in range(args.runs):
        generator = make_generator(seed + run, device)
        t0 = time.perf_counter()
        first = None
        samples = 0
        for chunk in model.generate(prefix, stream=True, generator=generator, **gen, **chunk_schedule(args)):
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
    codes = model.generate(prefix, generator=make_generator(seed, device), callback=on_step, **gen)
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
