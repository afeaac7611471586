"""Many streams on one GPU: aggregate real-time streams, per-stream time to first audio and on-time chunks.

Real-size Zonos-v0.1-hybrid and DAC 44.1 kHz with random bf16 weights, EOS suppressed (every request runs
exactly --frames frames), a random --prefix-token conditioning per request; one consumer thread per request
records when each chunk arrives. Two load shapes:

- burst (default): for each slot count S, 2·S requests arrive over --ramp seconds (uniformly, in a random order);
- open loop (--rates): Poisson arrivals at each rate (requests per second) for --duration seconds, on an engine
  of --slots[0] slots (the queue holds the rest), as a server sees them.

    python benchmarks/engine.py [--slots 1 8 32 64 128 256] [--frames 300] [--gemv] [--no-fused-sampling]
                                [--vocoder-batching off on] [--rates 20 40 60 --duration 20]

Per run it reports: wall ms per decode step and the step's byte floor (weights once, every busy row's SSM state read
and written, the KV rows attention reads, at the read bandwidth measured in the run) and their ratio; aggregate
real-time streams (audio seconds produced per wall second); concurrent streams held (requests between submit and
their last chunk, averaged over the arrivals' span); the share of streams produced faster than real time; TTFA
p50/p99 (submit to first chunk) and its queued + prefill part (submit to joining the decode steps); on-time chunks
(a chunk is late when it arrives after the audio handed out before it has finished playing), and which chunks of
their streams the late ones were; the engine worker's CPU time and the whole process's, per wall second (a worker
below 100% under load waits: for the interpreter lock, or in a blocking sleep; CUDA's waits spin, and count as CPU).
Runs use the engine's vocoder_batching on (its default: every stream a row of the vocoder slab, pushed every
--vocoder-frames steps; streams per slab push shown); --vocoder-batching off on adds a decoder per stream beside it.
Before each load Zonos.warmup(streams=slots) runs every bucket of busy slots twice.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
import traceback

import torch

from benchmarks.common import percentile, random_model, table
from benchmarks.gpu import read_bandwidth_gbs
from zonos.codec.autoencoder import DACAutoencoder
from zonos.codec.dac import DACConfig

FRAME_S = 512 / 44100


def no_eos(eos_token_id: int):
    def processor(logits: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        logits[:, 0, eos_token_id] = float("-inf")
        return logits

    return processor


def step_bytes(model, rows: int, kv_len: int) -> int:
    """Bytes a decode step over ``rows`` backbone rows must move at least."""
    weights = sum(p.numel() * p.element_size() for p in model.backbone.parameters())
    weights += model.heads_weight.numel() * model.heads_weight.element_size()
    state = model.backbone.allocate_inference_state(1, kv_len, device="meta")
    ssm = sum(c.ssm.numel() * c.ssm.element_size() for c in state.caches if hasattr(c, "ssm"))
    kv = sum(c.k.numel() * c.k.element_size() * 2 for c in state.caches if hasattr(c, "k"))
    return weights + rows * (2 * ssm + kv)


def burst(n: int, ramp: float, seed: int) -> list[float]:
    """``n`` arrival times spread uniformly over ``ramp`` seconds."""
    rng = random.Random(seed)
    return sorted(rng.uniform(0, ramp) for _ in range(n))


def poisson(rate: float, duration: float, seed: int) -> list[float]:
    """Arrival times of a Poisson process of ``rate`` per second over ``duration`` seconds."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append(t)


def held(records: list[dict], start: float, end: float, samples: int = 2000) -> float:
    """Mean number of requests between their submit and their last chunk over [start, end]."""
    if end <= start:
        return 0.0
    spans = [(r["submit"], r["end"]) for r in records]
    total = 0
    for k in range(samples):
        t = start + (end - start) * (k + 0.5) / samples
        total += sum(a <= t < b for a, b in spans)
    return total / samples


def run(
    model,
    slots: int,
    frames: int,
    prefix_tokens: int,
    arrivals: list[float],
    processor,
    seed: int,
    vocoder_streams: int,
    batching: bool,
    load: str,
    vocoder_frames: int,
    bandwidth: float,
) -> dict:
    """One load (``arrivals``, seconds from the start) on a fresh engine; ``bandwidth``: the device's read bytes/s,
    for the step's byte floor."""
    torch.cuda.reset_peak_memory_stats()
    n = len(arrivals)
    model.start_engine(
        slots=slots,
        max_seqlen=prefix_tokens + frames + 16,
        queue_size=max(n, 1),
        vocoder_streams=vocoder_streams,
        vocoder_batching=batching,
        vocoder_frames=vocoder_frames,
    )
    d = model.config.backbone.d_model
    g = torch.Generator("cuda").manual_seed(seed)
    distinct = min(n, 2 * slots)  # conditioning tensors, reused round-robin past that
    prefixes = [torch.randn(2, prefix_tokens, d, device="cuda", generator=g).to(model.dtype) for _ in range(distinct)]

    # Every bucket of busy slots, twice (a slab push is captured at the second occurrence of its shape), with this
    # run's logits processor: a push compiled during the run cost a quarter of the worker's time (py-spy, 20-40/s).
    model.warmup(prefix_tokens, frames=40, streams=slots, progress_bar=False, logits_processor=processor)
    engine = model.engine  # after the warm-up, whose compile-ahead pass may replace the engine
    records: list[dict] = [{} for _ in range(n)]
    worker_clock = time.pthread_getcpuclockid(engine._thread.ident)
    steps0, t0 = engine.steps, time.perf_counter()
    counters0 = _counters(engine)
    cpu0, worker0 = time.process_time(), time.clock_gettime(worker_clock)

    def consume(i: int) -> None:
        time.sleep(max(0.0, arrivals[i] - (time.perf_counter() - t0)))
        rec = records[i]
        rec["submit"] = time.perf_counter()
        handle = model.submit(prefixes[i % distinct], max_new_tokens=frames, stream=True, logits_processor=processor,
                              generator=torch.Generator("cuda").manual_seed(seed + i))  # fmt: skip
        chunks = []
        for chunk in handle:
            chunks.append((time.perf_counter(), chunk.audio.shape[-1] / 44100))
        rec["chunks"] = chunks
        rec["started"] = handle.started
        rec["end"] = time.perf_counter()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu, worker = time.process_time() - cpu0, time.clock_gettime(worker_clock) - worker0
    steps = engine.steps - steps0
    counters = {k: v - counters0[k] for k, v in _counters(engine).items()}
    ttfa, joined, late, total_chunks, realtime = [], [], 0, 0, 0
    late_at = [0, 0, 0]  # late chunks that were a stream's 2nd, 3rd to 5th, or a later one
    audio = 0.0
    for rec in records:
        chunks = [c for c in rec["chunks"] if c[1] > 0]
        first = chunks[0][0]
        ttfa.append(first - rec["submit"])
        joined.append(rec["started"] - rec["submit"])
        played_until = first
        for i, (when, seconds) in enumerate(chunks):
            total_chunks += 1
            if when > played_until + 1e-3:
                late += 1
                late_at[0 if i == 1 else 1 if i < 5 else 2] += 1
            played_until = max(played_until, when) + seconds
        length = sum(s for _, s in chunks)
        audio += length
        realtime += (rec["end"] - first) <= length
    step_s = wall / max(steps, 1)
    concurrent = held(records, t0 + min(arrivals), t0 + max(arrivals))
    busy = min(slots, max(1, round(concurrent)))  # the rows a step runs, on average
    floor = step_bytes(model, 2 * busy, prefix_tokens + frames // 2) / bandwidth
    vocoding = engine.vocoding
    model.engine.shutdown()
    return {
        "load": load,
        "slots": slots,
        "vocoder batching": f"slab, {vocoder_frames} frames" if batching else "off",
        "concurrent streams": concurrent,
        "streams per slab push": vocoding.rows_pushed / max(vocoding.pushes, 1) if vocoding is not None else 0.0,
        "steps/s": steps / wall,
        "ms/step": step_s * 1e3,
        "host ms/step: step / join / slab / GPU wait": " / ".join(
            f"{counters[k] * 1e3 / max(steps, 1):.2f}"
            for k in ("step_seconds", "join_seconds", "slab_seconds", "wait_seconds")
        ),
        "worker / process CPU %": f"{100 * worker / wall:.0f} / {100 * cpu / wall:.0f}",
        "seqs/join": counters["join_sequences"] / max(counters["join_batches"], 1),
        "pieces/step": counters["join_pieces"] / max(steps, 1),
        "floor ms/step": floor * 1e3,
        "÷ floor": step_s / floor,
        "RT streams": audio / wall,
        "faster than RT %": 100.0 * realtime / n,
        "TTFA p50 ms": percentile(ttfa, 50) * 1e3,
        "TTFA p99 ms": percentile(ttfa, 99) * 1e3,
        "queued+prefill p50 / p99 ms": f"{percentile(joined, 50) * 1e3:.0f} / {percentile(joined, 99) * 1e3:.0f}",
        "on-time chunks %": 100.0 - 100.0 * late / max(total_chunks, 1),
        "late: 2nd / 3rd-5th / later": " / ".join(map(str, late_at)),
        "GPU GiB peak": torch.cuda.max_memory_allocated() / 2**30,
    }


def _counters(engine) -> dict[str, float]:
    """The engine's cumulative counters the table differences: host seconds per part, joins and their pieces."""
    names = ("step_seconds", "join_seconds", "slab_seconds", "wait_seconds", "join_batches", "join_pieces",
             "join_sequences")  # fmt: skip
    return {name: getattr(engine, name) for name in names}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256], help="slot counts to run")
    ap.add_argument("--frames", type=int, default=300, help="frames per request (86 per second of audio)")
    ap.add_argument("--prefix-tokens", type=int, default=120, help="conditioning tokens per request")
    ap.add_argument("--ramp", type=float, default=1.0, help="burst: seconds over which the 2·S requests arrive")
    ap.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=None,
        help="open loop instead of bursts: Poisson arrival rates (requests/s), on --slots[0] slots",
    )
    ap.add_argument("--duration", type=float, default=20.0, help="open loop: seconds of arrivals per rate")
    ap.add_argument("--gemv", action="store_true", help="use_cute_gemv=True (decode projections of <= 8 rows)")
    ap.add_argument("--no-fused-sampling", action="store_true", help="use_accelerators(fused_sampling=False)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocoder-streams", type=int, nargs="+", default=[4], help="CUDA streams for the vocoders")
    ap.add_argument(
        "--vocoder-batching",
        choices=["off", "on"],
        nargs="+",
        default=["on"],
        help="engine vocoder_batching settings to run side by side (on, the engine's default: every stream a row of "
        "one vocoder slab; off: a decoder per stream)",
    )
    ap.add_argument("--vocoder-frames", type=int, nargs="+", default=[4], help="with batching on: frames per slab push")
    args = ap.parse_args()
    model = random_model("hybrid")
    model.use_accelerators(use_cute_gemv=args.gemv or None, fused_sampling=False if args.no_fused_sampling else None)
    model.autoencoder = DACAutoencoder(DACConfig(), device="cuda")
    processor = no_eos(model.eos_token_id)
    bandwidth = read_bandwidth_gbs() * 1e9
    print(f"read bandwidth {bandwidth / 1e9:.0f} GB/s; {torch.cuda.get_device_name()}")
    if args.rates:
        loads = [(args.slots[0], poisson(r, args.duration, args.seed), f"{r:g}/s for {args.duration:g} s")
                 for r in args.rates]  # fmt: skip
    else:
        loads = [(s, burst(2 * s, args.ramp, args.seed), f"burst of {2 * s}") for s in args.slots]
    rows = []
    for slots, arrivals, load in loads:
        settings = [(v, b == "on", f) for v in args.vocoder_streams for b in args.vocoder_batching
                    for f in (args.vocoder_frames if b == "on" else [4])]  # fmt: skip
        for v, batching, f in settings:
            try:
                row = run(model, slots, args.frames, args.prefix_tokens, arrivals, processor, args.seed, v, batching,
                          load, f, bandwidth)  # fmt: skip
                rows.append(row)
            except Exception as err:  # noqa: BLE001 - report and go on to the next load
                traceback.print_exception(err)
                print(f"{load}, slots={slots}: {type(err).__name__}: {err}")
            print(table(rows, "engine: streams per GPU") if rows else "", flush=True)


if __name__ == "__main__":
    main()
