"""The speech server under open-loop load: TTFA, streaming viability and aggregate real-time streams per
request rate, through HTTP on loopback.

An in-process uvicorn runs the server (:mod:`zonos.serve`) on 127.0.0.1; an asyncio client in a second process sends
``POST /v1/zonos/speech`` requests (pcm, streamed) for --duration seconds and reads every response to its end:
first closed loop with each --streams count of clients (each sends its next request when the last has finished:
TTFA at that many concurrent streams), then open loop at Poisson arrival times of each --rates value (requests
per second, sent without waiting for answers). EOS is suppressed, so every request streams exactly --frames frames.

    python benchmarks/serving.py --tiny                         # CPU smoke run: tiny random model
    python benchmarks/serving.py --streams 1 32 --rates 5 10 20 25 30 --frames 860 --slots 256

Without --tiny: the published hybrid architecture and the 44.1 kHz DAC with random bf16 weights on CUDA, fast ops
and CUDA graphs on, warmed up (kernels compiled, graphs captured) before the first rate.

Per load it reports: requests sent, answered in full, and errors (non-200 answers, short or broken streams);
TTFA p50/p90/p99 (request sent to first audio bytes received); streaming viability (the share of audio pieces
that arrive before the audio received earlier in the same response has finished playing, playback starting at the
first piece); aggregate real-time streams (audio seconds received per wall second, from the first request sent to
the last response finished); and the peak number of responses open at once (at rate r, about r x request duration).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import no_eos, percentile, random_model, table  # noqa: E402

SAMPLE_RATE = 44_100
TEXT = "The quick brown fox jumps over the lazy dog, and the server streams every word of it as it is spoken."


def build_model(args):
    """The model the server runs: tiny and random on the CPU (--tiny), else real-size random on CUDA."""
    if args.tiny:
        import tempfile

        from tests.tiny import tiny_model

        return tiny_model(Path(tempfile.mkdtemp()), max_seqlen=args.max_seqlen)
    from zonos.codec.autoencoder import DACAutoencoder
    from zonos.codec.dac import DACConfig

    torch.manual_seed(0)
    model = random_model("hybrid", device=args.device, max_seqlen=args.max_seqlen)
    model.autoencoder = DACAutoencoder(DACConfig(), device=args.device)
    model.use_accelerators(use_cute_gemv=args.gemv)
    return model


class Server:
    """uvicorn on 127.0.0.1 at a free port, in a thread."""

    def __init__(self, app):
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", backlog=4096)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


async def one_request(client, body: dict, expect_samples: int, stats: dict) -> None:
    """Send one request and read it to the end, recording TTFA, per-piece viability and audio received."""
    sent = time.perf_counter()
    received = 0
    first = None
    late = pieces = 0
    stats["open"] += 1
    stats["peak"] = max(stats["peak"], stats["open"])
    try:
        async with client.stream("POST", "/v1/zonos/speech", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                stats["errors"].append(f"{r.status_code}")
                return
            async for data in r.aiter_raw():
                if not data:
                    continue
                now = time.perf_counter()
                if first is None:
                    first = now
                    stats["ttfa"].append(now - sent)
                else:
                    pieces += 1
                    late += now > first + (received // 2) / SAMPLE_RATE  # the audio so far has finished playing
                received += len(data)
        if received // 2 != expect_samples:
            stats["errors"].append(f"short stream ({received // 2} of {expect_samples} samples)")
            return
        stats["done"] += 1
        stats["pieces"] += pieces
        stats["late"] += late
        stats["audio"] += received / 2 / SAMPLE_RATE
    except Exception as err:  # noqa: BLE001 - a load test counts failures instead of stopping
        stats["errors"].append(type(err).__name__)
    finally:
        stats["open"] -= 1
        stats["last"] = time.perf_counter()


async def run_load(
    url: str, rate: float | None, streams: int | None, duration: float, frames: int, expect: int, seed: int
) -> dict:
    """Open loop (``rate`` requests a second, Poisson arrivals) or closed loop (``streams`` clients, each sending
    its next request when the last one has finished) for ``duration`` seconds of sending."""
    import httpx

    rng = random.Random(seed)
    stats = dict(ttfa=[], errors=[], done=0, pieces=0, late=0, audio=0.0, open=0, peak=0, last=0.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    count = 0

    def body() -> dict:
        nonlocal count
        count += 1
        return dict(input=TEXT, seed=seed * 100_000 + count, response_format="pcm", max_new_tokens=frames)

    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits) as client:
        start = time.perf_counter()
        if rate is not None:
            tasks, t = [], 0.0
            while True:
                t += rng.expovariate(rate)
                if t > duration:
                    break
                delay = start + t - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one_request(client, body(), expect, stats)))
            await asyncio.gather(*tasks)
        else:

            async def worker(k: int) -> None:
                await asyncio.sleep(k * 0.01)  # staggered starts, as clients arrive
                while time.perf_counter() - start < duration:
                    await one_request(client, body(), expect, stats)

            await asyncio.gather(*(worker(k) for k in range(streams)))
    wall = max(stats["last"] - start, 1e-9)
    ms = [1000 * x for x in stats["ttfa"]] or [float("nan")]
    return {
        "load": f"{rate:g} req/s" if rate is not None else f"{streams} stream{'s' * (streams != 1)}",
        "sent": count,
        "done": stats["done"],
        "errors": len(stats["errors"]),
        "TTFA p50 (ms)": percentile(ms, 50),
        "TTFA p90 (ms)": percentile(ms, 90),
        "TTFA p99 (ms)": percentile(ms, 99),
        "viable (%)": 100.0 * (1 - stats["late"] / max(stats["pieces"], 1)),
        "RT streams": stats["audio"] / wall,
        "peak open": stats["peak"],
        "_errors": stats["errors"][:5],
    }


def client_run(*args) -> dict:
    """:func:`run_load` in the client process (its own interpreter, so the client's Python work does not compete
    with the server's engine and event-loop threads for one GIL)."""
    return asyncio.run(run_load(*args))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="the tiny random model on the CPU (a smoke run)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--rates", type=float, nargs="*", default=None, help="open loop: requests per second, one run each")
    p.add_argument(
        "--streams",
        type=int,
        nargs="*",
        default=None,
        help="closed loop: concurrent clients, one run each (e.g. 1 32 for TTFA at 1 and 32 streams)",
    )
    p.add_argument("--duration", type=float, default=None, help="seconds of arrivals per rate")
    p.add_argument("--frames", type=int, default=None, help="frames per request (86 per second of audio)")
    p.add_argument("--slots", type=int, default=None)
    p.add_argument("--queue-size", type=int, default=1024)
    p.add_argument(
        "--max-seqlen", type=int, default=None, help="positions per slot (default: --frames + 512, room for the prompt)"
    )
    p.add_argument("--gemv", action="store_true", help="CuTeDSL GEMVs for the decode projections")
    args = p.parse_args()
    if args.tiny:
        args.device = "cpu"
        defaults = dict(rates=[1, 2, 4], streams=[1, 4], duration=4.0, frames=40, slots=8)
    else:
        defaults = dict(rates=[5, 10, 20, 25, 30], streams=[1, 32], duration=30.0, frames=860, slots=256)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.max_seqlen = args.max_seqlen or args.frames + 512

    from zonos.serve import ServerSettings, create_app

    model = build_model(args)
    settings = ServerSettings(
        slots=args.slots,
        queue_size=args.queue_size,
        max_seqlen=args.max_seqlen,
        rate_limit=None,
        max_new_tokens=args.frames,
        logits_processor=no_eos(model),
        warmup=not args.tiny,
        max_body_bytes=1 << 20,
    )
    t0 = time.perf_counter()
    server = Server(create_app(lambda: model, settings))
    print(
        f"server up in {time.perf_counter() - t0:.1f} s on {model.device} ({model.dtype}), {args.slots} slots",
        file=sys.stderr,
    )
    expect = args.frames * 512
    url = f"http://127.0.0.1:{server.port}"
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as client:
            warm = 2.0 if args.tiny else 5.0
            client.submit(client_run, url, None, 2, warm, args.frames, expect, 999).result()  # warm the path
            rows = []
            loads = [(None, n) for n in args.streams] + [(r, None) for r in args.rates]
            for k, (rate, streams) in enumerate(loads):
                row = client.submit(client_run, url, rate, streams, args.duration, args.frames, expect, k).result()
                errors = row.pop("_errors")
                if errors:
                    print(f"{row['load']}: errors such as {errors}", file=sys.stderr)
                rows.append(row)
                print(f"{row['load']}: done", file=sys.stderr)
    finally:
        server.stop()
    device = torch.cuda.get_device_name() if model.device.type == "cuda" else "cpu"
    size = "tiny" if args.tiny else "hybrid real-size"
    title = (
        f"serving: {size} random weights on {device}, {args.slots} slots, {args.frames} frames "
        f"({args.frames / 86.13:.1f} s) per request, {args.duration:g} s of sending per load"
    )
    print(table(rows, title))


if __name__ == "__main__":
    main()
