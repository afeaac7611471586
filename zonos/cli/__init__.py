"""The ``zonos-tts`` command line: ``speak`` (text to an audio file or stdout), ``voice`` (a clip to a saved
speaker embedding), ``bench`` (time to first audio, real-time factor and step time here), ``warmup`` (compile
the GPU kernels into the kernel cache now), ``demo`` and ``serve``.

Every argument is checked before a model loads: a bad one prints one ``error: ...`` line and exits with
status 2, and so does a :class:`zonos.errors.ZonosInputError` (any ``ValueError``) raised after loading.
Output files are written to a temporary file beside the target and renamed into place at the end, so a
failure never leaves a partial file. A write that fails (a full disk, standard output closed by its reader)
prints one ``error:`` line and exits with status 1. Status lines go to stderr; stdout carries only audio
(``--out -``) or the ``bench`` table.

One module per subcommand (:mod:`~zonos.cli.speak`, :mod:`~zonos.cli.voice`, :mod:`~zonos.cli.bench`,
:mod:`~zonos.cli.warmup`; ``serve`` is :mod:`zonos.serve.command`); :mod:`~zonos.cli.common` holds what they and
``serve`` share (parser, model flags and loader, errors, the run wrapper), :mod:`~zonos.cli.generation` the
generation flags of ``speak`` and ``bench``, :mod:`~zonos.cli.output` the audio outputs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from zonos import __version__
from zonos.cli.bench import bench_main
from zonos.cli.common import Parser, log
from zonos.cli.speak import speak_main
from zonos.cli.voice import voice_main
from zonos.cli.warmup import warmup_main

__all__ = ["bench_main", "demo_main", "main", "speak_main", "voice_main", "warmup_main"]

_COMMANDS = {
    "speak": "speak text into an audio file or stdout",
    "voice": "turn a voice clip into a speaker-embedding file",
    "bench": "measure time to first audio, real-time factor and step time here",
    "warmup": "compile the GPU kernels into the kernel cache now, so later runs here start without compiling",
    "demo": "serve the streaming web demo (arguments go to gradio_interface; see `zonos-tts demo --help`)",
    "serve": "serve OpenAI-compatible streaming speech over HTTP (needs the server extra)",
}


def _top_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="zonos-tts",
        description="Zonos text-to-speech, accelerated and streaming. `zonos-tts COMMAND --help` lists each "
        "command's flags.",
    )
    p.add_argument("--version", action="version", version=f"zonos-tts {__version__}", help="print the version")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in _COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return p


def demo_main(argv: Sequence[str] | None = None) -> int:
    """``zonos-tts demo``: the Gradio demo's own command line (``gradio_interface.main``)."""
    try:
        demo = importlib.import_module("gradio_interface")
    except ModuleNotFoundError as e:
        if e.name != "gradio_interface":
            raise
        log("error: the demo (gradio_interface.py) is not installed here; run it from a checkout of the repository")
        return 2
    return demo.main(list(argv or []))


def _serve_main(argv: Sequence[str] | None = None, prog: str = "zonos-tts serve") -> int:
    """``zonos-tts serve``: the speech server (:mod:`zonos.serve.command`)."""
    from zonos.serve.command import serve_main

    return serve_main(argv, prog)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``zonos-tts`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "speak": speak_main,
        "voice": voice_main,
        "bench": bench_main,
        "warmup": warmup_main,
        "demo": demo_main,
        "serve": _serve_main,
    }
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:]) if argv[0] == "demo" else commands[argv[0]](argv[1:], f"zonos-tts {argv[0]}")
    _top_parser().parse_args(argv)  # prints help, the version, or an error for an unknown command
    return 2
