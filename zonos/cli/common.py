"""What the command line's subcommands (and ``zonos-tts serve``, :mod:`zonos.serve.command`) share: the
argument parser with one-line errors, the model flags and their checks, the model loader, and the run wrapper
that turns errors into one ``error:`` line and an exit status (2 for bad input, 1 for a failed write)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = [
    "DEFAULT_CODEC",
    "DEFAULT_MODEL",
    "DEFAULT_SPEAKER_MODEL",
    "OutputError",
    "Parser",
    "UsageError",
    "add_model_args",
    "check_clip",
    "check_device",
    "check_model_source",
    "check_positive",
    "check_writable",
    "error",
    "help_formatter",
    "load_model",
    "log",
    "run_command",
]

DEFAULT_MODEL = "Zyphra/Zonos-v0.1-hybrid"


DEFAULT_CODEC = "descript/dac_44khz"


DEFAULT_SPEAKER_MODEL = "Zyphra/Zonos-v0.1-speaker-embedding"


class UsageError(Exception):
    """A bad command-line input, found before any model loads; printed as one ``error:`` line, exit status 2."""


class OutputError(Exception):
    """Writing the audio failed (a full disk, a closed standard output); printed as one ``error:`` line, exit
    status 1."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``error: ... (see PROG --help)``) instead of usage plus message."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def help_formatter() -> type:
    """The help formatter of every subcommand's parser (imported when a parser is built)."""
    from zonos.utils import HelpFormatter

    return HelpFormatter


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model, codec, device and accelerator flags (what :func:`load_model` reads)."""
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
    scan = p.add_mutually_exclusive_group()
    scan.add_argument(
        "--cute-scan",
        action="store_true",
        help="require the prefill's Mamba2 SSD scan on our CuTeDSL kernel (CUDA only; needs nvidia-cutlass-dsl from "
        "pip install 'zonos-accel[gpu]'): an error where it cannot run. Without either flag it is on where it can run",
    )
    scan.add_argument(
        "--no-cute-scan",
        action="store_true",
        help="run the prefill's SSD scan on our Triton kernels (with the fast ops) or torch instead",
    )
    p.add_argument(
        "--no-fused-sampling",
        action="store_true",
        help="sample each decode step's tokens with the torch ops (~100 kernels) instead of the two Triton launches "
        "the fast ops use by default (2.07 against 1.91 ms per step on an H200)",
    )
    p.add_argument(
        "--fused-blocks",
        action="store_true",
        help="run each block's decode step through fused Triton GEMVs (norms and activations inside the projections; "
        "CUDA only, batches up to 8 with CFG; experimental, off by default until it is timed)",
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
    p.add_argument(
        "--kernel-cache",
        metavar="DIR",
        default=None,
        help="on CUDA: keep the compiled Triton and CuTeDSL kernels in DIR, so that later runs load them instead of "
        "compiling (default: $ZONOS_KERNEL_CACHE, else $XDG_CACHE_HOME/zonos/kernels, i.e. ~/.cache/zonos/kernels)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def check_model_source(name: str, flag: str, files: Sequence[str]) -> None:
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


def check_device(spec: str | None, args: argparse.Namespace | None = None):
    """``--device`` as a ``torch.device`` this machine has (default: CUDA if available), and the CuTeDSL flags in
    ``args`` possible on it; raises :class:`UsageError`."""
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
    for flag in ("cute_gemv", "cute_scan", "fused_blocks"):
        if args is None or not getattr(args, flag, False):
            continue
        option = "--" + flag.replace("_", "-")
        if device.type != "cuda":
            raise UsageError(f"{option} runs CUDA kernels and the model would be on {device}: drop it, or use a GPU")
        if flag == "fused_blocks":
            if importlib.util.find_spec("triton") is None:
                raise UsageError(f"{option} needs triton: pip install 'zonos-accel[gpu]', or drop {option}")
            continue
        if importlib.util.find_spec("cutlass") is None:
            raise UsageError(f"{option} needs nvidia-cutlass-dsl: pip install 'zonos-accel[gpu]', or drop {option}")
    return device


def cute_scan_flag(args: argparse.Namespace) -> bool | None:
    """``use_cute_scan`` from ``--cute-scan`` (True) and ``--no-cute-scan`` (False); None (on where it can run)
    without either."""
    if getattr(args, "cute_scan", False):
        return True
    return False if getattr(args, "no_cute_scan", False) else None


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """Each of ``args``' ``names`` that is given is at least 1."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def check_writable(path: Path, flag: str) -> None:
    """``path`` (given by ``flag``) can be created or replaced: not a directory, in a writable directory."""
    parent = path.parent
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: the directory {parent} does not exist; create it first (mkdir -p {parent})")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot write into {parent} (permission denied); pick another directory")


def check_clip(path: str, flag: str) -> None:
    """``path`` (given by ``flag``) is an audio file of a usable sample rate, long enough to embed a voice."""
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


def load_model(args: argparse.Namespace, device):
    """The Zonos model and codec named by ``args`` on ``device``, with the accelerator flags applied; on CUDA the
    kernel cache (``--kernel-cache``) is chosen first, before anything compiles or imports CuTeDSL."""
    from zonos.codec import DACAutoencoder
    from zonos.model import Zonos

    if device.type == "cuda":
        from zonos_accel.kernel_cache import use_kernel_cache

        use_kernel_cache(getattr(args, "kernel_cache", None))
    t0 = time.perf_counter()
    codec = DACAutoencoder.from_pretrained(args.codec, device=device)
    model = Zonos.from_pretrained(
        args.model,
        device=device,
        autoencoder=codec,
        fast_ops=False if args.no_fast_ops else None,
        cuda_graphs=False if args.no_cuda_graphs else None,
        use_cute_gemv=args.cute_gemv,
        use_cute_scan=cute_scan_flag(args),
        fused_sampling=False if getattr(args, "no_fused_sampling", False) else None,
        fused_blocks=getattr(args, "fused_blocks", False),
    )
    log(f"loaded {args.model} on {device} in {time.perf_counter() - t0:.1f} s")
    return model


def run_command(work: Callable[[], int]) -> int:
    """Run ``work``, turning input errors into one ``error:`` line and status 2."""
    try:
        return work()
    except (UsageError, ValueError, FileNotFoundError) as e:  # ZonosInputError / CheckpointError are ValueErrors
        error(e)
        return 2
    except OutputError as e:
        error(e)
        _drop_stdout()
        return 1
    except BrokenPipeError:  # a status line or the bench table whose reader went away
        error("standard output was closed by its reader before the command finished")
        _drop_stdout()
        return 1
    except KeyboardInterrupt:
        log("interrupted (an output file is written only when speech is complete)")
        return 130


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so that Python's flush at exit does not fail again on a closed pipe
    (it would print "Exception ignored ... BrokenPipeError")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no stdout, or an in-memory one (tests)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def log(message: str) -> None:
    """A status line on stderr."""
    print(message, file=sys.stderr, flush=True)


def error(message: object) -> None:
    """Print ``error: message`` on one line (a multi-line message is joined)."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    log(f"error: {' '.join(lines)}")
