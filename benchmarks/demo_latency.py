"""The web demo's time to first audio on localhost: over HTTP, or from the Generate click in a real browser.

Serves ``gradio_interface.build_app`` in a child process (uvicorn on a free 127.0.0.1 port). By default it posts
the page's request to ``POST /zonos/stream`` as its script does, ``--requests`` times, and prints for each the
client's time from sending the request to holding the first PCM frame, and the server's own time to first audio
(``ttfa_ms`` of the ``first_audio`` event: route entry → first chunk).

With ``--browser`` it drives chromium (selenium and chromedriver, as tests/test_browser.py does) and clicks
Generate ``--requests`` times, printing what the page measured: click → first sample scheduled on the page's
AudioContext, the server's TTFA, and what the browser and HTTP add between them (Gradio's dispatch of the click,
the request, scheduling the chunk). The target for that difference is 100 ms; Gradio's own audio component added
~1,300 ms. On the CPU the model gets one core fewer than the machine, so chromium has one of its own (on a shared
2-core runner the two competing moved the page's handling of the first chunk by 100-250 ms).

The model is the published hybrid architecture with random bf16 weights (``benchmarks/common.py``; a
request may end early at a random EOS, which does not move its first audio), a random real-size DAC, and
accelerators as ``from_local`` sets them, warmed up with the demo's schedule. Text goes through espeak as
on the page. On the GPU machine:

    source .device/activate.sh && python3 benchmarks/demo_latency.py [--cute-gemv] [--browser]

CPU smoke test (tiny model from tests/tiny.py):

    PYTHONPATH=. .venv/bin/python benchmarks/demo_latency.py --tiny --requests 3 [--browser]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gradio_interface as gi  # noqa: E402
from benchmarks.common import percentile, random_model, table  # noqa: E402
from tests.test_gradio_interface import serve  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and then it naps in the afternoon sun."


def first_pcm(client: httpx.Client, url: str, body: dict) -> tuple[float, float, int]:
    """(client ms to the first PCM frame, server ttfa_ms, samples) of one streamed request."""
    t0 = time.perf_counter()
    client_ms = server_ms = None
    buf, samples = b"", 0
    with client.stream("POST", url + "zonos/stream", json=body, timeout=120) as resp:
        if resp.status_code != 200:
            raise SystemExit(f"HTTP {resp.status_code}: {resp.read().decode()}")
        for data in resp.iter_raw():
            buf += data
            while len(buf) >= gi.FRAME_HEADER.size:
                kind, size = gi.FRAME_HEADER.unpack_from(buf)
                if len(buf) < gi.FRAME_HEADER.size + size:
                    break
                (item,) = gi.decode_frames(buf[: gi.FRAME_HEADER.size + size])
                buf = buf[gi.FRAME_HEADER.size + size :]
                if kind == gi.FRAME_PCM:
                    client_ms = client_ms or 1000 * (time.perf_counter() - t0)
                    samples += item.size
                elif item["event"] == "first_audio":
                    server_ms = item["ttfa_ms"]

                elif item["event"] == "error":
                    raise SystemExit(item["message"])
    return client_ms, server_ms, samples


def build_model(args: argparse.Namespace):
    if args.tiny:
        import tempfile

        from tests.tiny import tiny_model

        return tiny_model(Path(tempfile.mkdtemp()), max_seqlen=1024)
    from zonos.codec import DACAutoencoder
    from zonos.codec.dac import DACConfig

    torch.manual_seed(0)
    model = random_model("hybrid", autoencoder=DACAutoencoder(DACConfig(), device="cuda"))
    model.use_accelerators(use_cute_gemv=args.cute_gemv or None)
    return model


def server(args: argparse.Namespace, schedule: dict, ready) -> None:
    """The demo's process: build, warm up, serve until killed; puts its URL on ``ready``."""
    model = build_model(args)
    if model.device.type == "cuda":
        sampling = gi.SynthesisRequest().sampling_params()  # the page's defaults, which the requests use
        seconds = model.warmup(all_prefill_lengths=True, sampling_params=sampling, progress_bar=False, **schedule)
        print(f"warm-up: {seconds:.1f} s", flush=True)
    elif args.browser:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))  # a core for chromium
    # The page's controls start at the request the HTTP mode posts, so a click sends the same.
    defaults = gi.SynthesisRequest(text=TEXT, max_new_tokens=args.frames, randomize_seed=False, seed=1)
    app = gi.build_app(lambda name: model, ["model"], device=model.device, defaults=defaults, **schedule)
    with serve(app) as url:
        ready.put(url)
        while True:
            time.sleep(1)


def http_rows(url: str, requests: int, frames: int) -> list[dict]:
    body = {"text": TEXT, "max_new_tokens": frames, "randomize_seed": False, "seed": 1}
    # One connection, kept alive and without Nagle's algorithm, as the browser's fetch has.
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    client = httpx.Client(transport=httpx.HTTPTransport(socket_options=nodelay))
    first_pcm(client, url, body)  # the first request pays espeak's start-up and the first prefill length
    rows = []
    for i in range(requests):
        client_ms, server_ms, samples = first_pcm(client, url, {**body, "seed": i})
        rows.append(
            {
                "request": i,
                "client first PCM ms": client_ms,
                "server TTFA ms": server_ms,
                "HTTP overhead ms": client_ms - server_ms,
                "audio s": samples / 44100,
            }
        )
    return rows


# The player's script has run and Gradio has rendered the buttons and the player's status line.
PAGE_READY = (
    "return !!(window.zonosPlayer && document.querySelector('#zonos-generate') && "
    "document.querySelector('#zonos-status'))"
)


def _wait(driver, script: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := driver.execute_script(script):
            return value
        time.sleep(0.02)
    raise SystemExit(f"timed out after {timeout} s waiting for: {script}")


def browser_rows(url: str, requests: int) -> list[dict]:
    """Click Generate ``requests`` times (after one click that pays espeak's start-up); what the page measured."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if not (chromium and chromedriver):
        raise SystemExit("--browser needs chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--autoplay-policy=no-user-gesture-required", "--window-size=1366,768"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    rows = []
    try:
        driver.get(url)
        _wait(driver, PAGE_READY)
        for i in range(requests + 1):
            before = driver.execute_script("return window.zonosPlayer.stats.requests")
            driver.find_element("css selector", "#zonos-generate").click()
            _wait(driver, f"return window.zonosPlayer.stats.requests > {before}")
            _wait(driver, "return ['done', 'error', 'stopped'].includes(window.zonosPlayer.stats.state)")
            stats = driver.execute_script("return Object.assign({}, window.zonosPlayer.stats)")
            if stats["state"] != "done":
                raise SystemExit(f"request {i}: {stats['state']}: {stats['message']}")
            if i == 0:
                continue
            ms = {key: float(stats[key]) for key in ("clickToFirstAudioMs", "serverTtfaMs", "clickToFetchMs",
                                                        "clickToResponseMs", "outputLatencyMs")}  # fmt: skip
            rows.append(
                {
                    "request": i - 1,
                    "click → first audio ms": ms["clickToFirstAudioMs"],
                    "server TTFA ms": ms["serverTtfaMs"],
                    "browser + HTTP ms": ms["clickToFirstAudioMs"] - ms["serverTtfaMs"],
                    "click → request sent ms": ms["clickToFetchMs"],
                    "click → response ms": ms["clickToResponseMs"],
                    "output latency ms": ms["outputLatencyMs"],
                    "gaps": stats["underruns"],
                    "audio s": stats["samplesScheduled"] / 44100,
                }
            )
    finally:
        driver.quit()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=10)
    p.add_argument("--frames", type=int, default=200, help="frames per request (86 ≈ 1 s)")
    p.add_argument("--first-chunk-frames", type=int, default=gi.DEFAULT_FIRST_CHUNK_FRAMES)
    p.add_argument("--chunk-frames", type=int, default=gi.DEFAULT_CHUNK_FRAMES)
    p.add_argument("--cute-gemv", action="store_true", help="decode projections through the CuTeDSL GEMVs")
    p.add_argument("--tiny", action="store_true", help="the tiny CPU model of tests/tiny.py (a smoke test)")
    p.add_argument("--browser", action="store_true", help="click Generate in chromium instead of posting requests")
    args = p.parse_args()
    schedule = {"first_chunk_frames": args.first_chunk_frames, "chunk_frames": args.chunk_frames}

    # The server runs in its own process, as it does for a browser: a client sharing its GIL would be late.
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    proc = ctx.Process(target=server, args=(args, schedule, ready), daemon=True)
    proc.start()
    try:
        url = ready.get(timeout=900)
        rows = browser_rows(url, args.requests) if args.browser else http_rows(url, args.requests, args.frames)
    finally:
        proc.terminate()
        proc.join(10)
    device = "cpu (tiny)" if args.tiny else "cuda"
    where = "in chromium, from the Generate click" if args.browser else "over HTTP on localhost"
    print(
        table(
            rows,
            f"Demo {where}: {device}, schedule {args.first_chunk_frames}x{args.chunk_frames}, {args.frames} frames",
        )
    )
    label = "click → first audio" if args.browser else "client first PCM"
    client = [r[f"{label} ms"] for r in rows]
    server_ttfa = [r["server TTFA ms"] for r in rows]
    added = [c - s for c, s in zip(client, server_ttfa)]
    print(
        f"\np50 {label} {statistics.median(client):.1f} ms (p90 {percentile(client, 90):.1f}), "
        f"p50 server TTFA {statistics.median(server_ttfa):.1f} ms (p90 {percentile(server_ttfa, 90):.1f}), "
        f"p50 added {statistics.median(added):.1f} ms (p90 {percentile(added, 90):.1f})"
    )


if __name__ == "__main__":
    main()
