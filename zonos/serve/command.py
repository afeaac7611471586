"""``zonos-tts serve``: load a model and run the speech server (:mod:`zonos.serve.app`) under uvicorn.

Binds 127.0.0.1 unless ``--host`` says otherwise; ``--api-key`` (or ``ZONOS_API_KEY``) makes every request but
``/health`` carry ``Authorization: Bearer KEY``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path


def _parser(prog: str) -> argparse.ArgumentParser:
    from zonos.cli import common

    p = common.Parser(
        prog=prog,
        description="Serve OpenAI-compatible streaming speech (POST /v1/audio/speech) and the native Zonos API over "
        "HTTP on the engine.",
        formatter_class=common.help_formatter(),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=int, default=8000, help="TCP port")
    p.add_argument(
        "--api-key",
        default=os.environ.get("ZONOS_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every request but /health (default: $ZONOS_API_KEY; none)",
    )
    p.add_argument(
        "--voices-dir",
        default=str(Path("~/.local/share/zonos-tts/voices").expanduser()),
        help="where POST /v1/audio/voices stores voice files, and named voices are read from",
    )
    p.add_argument("--slots", type=int, default=8, help="requests decoded together (engine slots)")
    p.add_argument(
        "--vocoder-batching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decode the frames of all concurrent streams together, as rows of one vocoder slab (the same audio)",
    )
    p.add_argument("--queue-size", type=int, default=64, help="requests that may wait for a slot before 503s")
    p.add_argument("--max-seqlen", type=int, default=None, help="positions per slot (default: the model's, 4096)")
    p.add_argument("--max-input-chars", type=int, default=4096, help="longest input text per request")
    p.add_argument(
        "--rate-limit", type=float, default=120.0, help="requests per minute per API key or client address (0: none)"
    )
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="on CUDA: skip compiling kernels and capturing graphs (every prompt length, every bucket of busy slots) "
        "before taking requests; without the warm-up the first requests at each new load pay for them",
    )
    common.add_model_args(p)
    return p


def serve_main(argv: Sequence[str] | None = None, prog: str = "zonos-tts serve") -> int:
    """``zonos-tts serve``: returns the exit status (2 for a bad argument)."""
    from zonos.cli import common

    args = _parser(prog).parse_args(argv)
    try:
        for name in ("slots", "queue_size", "max_input_chars"):
            if getattr(args, name) < 1:
                raise common.UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
        if args.max_seqlen is not None and args.max_seqlen < 16:
            raise common.UsageError(f"--max-seqlen must be at least 16 (positions per slot), got {args.max_seqlen}")
        if not 0 < args.port < 65536:
            raise common.UsageError(f"--port {args.port}: give a TCP port in 1..65535")
        if not args.rate_limit >= 0:  # NaN too
            raise common.UsageError(f"--rate-limit must be 0 (none) or positive, got {args.rate_limit}")
        common.check_model_source(args.model, "--model", ("config.json", "model.safetensors"))
        common.check_model_source(args.codec, "--codec", ("config.json", "model.safetensors"))
        device = common.check_device(args.device, args)
        try:
            import uvicorn

            from zonos.serve import ServerSettings, create_app
        except ModuleNotFoundError as e:
            raise common.UsageError(f"the server needs {e.name}: pip install 'zonos-accel[server]'") from None
    except common.UsageError as e:
        common.error(e)
        return 2
    settings = ServerSettings(
        api_key=args.api_key or None,
        voices_dir=Path(args.voices_dir).expanduser(),
        max_input_chars=args.max_input_chars,
        rate_limit=args.rate_limit or None,
        slots=args.slots,
        vocoder_batching=args.vocoder_batching,
        queue_size=args.queue_size,
        max_seqlen=args.max_seqlen,
        warmup=not args.no_warmup,
        model_name=args.model,
    )
    model = None

    def load() -> int:  # before uvicorn: a bad checkpoint or a plan that does not fit is one line, not a traceback
        nonlocal model
        from zonos.engine import check_memory

        model = common.load_model(args, device)
        check_memory(model, args.slots, args.max_seqlen or model.max_seqlen, vocoder_batching=args.vocoder_batching)
        return 0

    code = common.run_command(load)
    if code:
        return code
    app = create_app(lambda: model, settings)
    common.log(f"serving on http://{args.host}:{args.port} (key {'required' if settings.api_key else 'off'})")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
