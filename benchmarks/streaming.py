"""Streaming latency on a GPU: time-to-first-audio, steady per-frame latency and real-time factor per
chunk schedule, the split of the first-audio path, and the streaming vocoder's cost per frame against
one-shot decoding.

Real-size Zonos-v0.1-hybrid and DAC 44.1 kHz with random bf16 weights; EOS suppressed so every run
generates exactly --frames frames; a random 120-token prefix stands in for the text conditioning.

    python benchmarks/streaming.py [--frames 300] [--reps 10] [--no-accel | --gemv]

``--gemv`` adds ``use_cute_gemv`` (the CuTeDSL decode projections) to the default accelerators: the fastest
configuration a user can choose, whose shorter decode steps shorten the time to first audio.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from common import cuda_time, no_eos, percentile, random_model, table

from zonos.codec.autoencoder import DACAutoencoder
from zonos.codec.dac import DACConfig
from zonos.codec.streaming import StreamingDACDecoder, receptive_field
from zonos.ops.backend import REFERENCE, use_backend

FRAME_S = 512 / 44100  # 11.61 ms of audio per frame


@contextlib.contextmanager
def torch_layer_ops(codec: DACAutoencoder):
    """The codec's decoder layers on the torch references (cuDNN convs), its other ops as they are."""
    backend = codec.dac.ops
    names = ("conv1d", "conv_transpose1d", "sequence_tail")
    use_backend(codec.dac, backend.replace(f"{backend.name}, torch layers", **{n: REFERENCE.op(n) for n in names}))
    try:
        yield
    finally:
        use_backend(codec.dac, backend)


def vocoder_cost(codec: DACAutoencoder, frames: int, chunk_sizes: list[int]) -> list[dict]:
    """Seconds per frame of one-shot decode vs streaming pushes of each chunk size: the whole stream (its flush
    included, paid once per stream) and its pushes alone (the steady per-frame cost); SNR of the stream."""
    codes = torch.randint(0, 1024, (1, 9, frames), device="cuda")
    one_shot = cuda_time(lambda: codec.decode(codes)) / frames
    ref = codec.decode(codes).float()
    with torch_layer_ops(codec):
        one_shot_torch = cuda_time(lambda: codec.decode(codes)) / frames
    dec = StreamingDACDecoder(codec)
    rows = []
    for c in chunk_sizes:
        out: list[torch.Tensor] = []
        host: list[float] = []  # seconds of each push() call: the CPU's part, which the GPU need not wait for

        def stream(c=c, out=out, host=host):
            dec.reset()
            out.clear()
            host.clear()
            for s in range(0, frames, c):
                t0 = time.perf_counter()
                out.append(dec.push(codes[..., s : s + c]))
                host.append(time.perf_counter() - t0)
            out.append(dec.flush())

        def pushes(c=c):  # the stream without its end: the steady per-frame cost
            dec.reset()
            for s in range(0, frames, c):
                dec.push(codes[..., s : s + c])

        per_frame = cuda_time(stream) / frames
        push_per_frame = cuda_time(pushes) / frames
        audio = torch.cat(out, -1)
        snr = 10 * torch.log10(ref.pow(2).sum() / (ref - audio).pow(2).sum().clamp_min(1e-30))
        rows.append(
            {
                "chunk frames": c,
                "one-shot ms/frame": 1000 * one_shot,
                "one-shot torch (cuDNN) ms/frame": 1000 * one_shot_torch,
                "streamed ms/frame": 1000 * per_frame,
                "pushes only ms/frame": 1000 * push_per_frame,
                "flush µs (difference)": 1e6 * (per_frame - push_per_frame) * frames,
                "push host µs (median)": 1e6 * statistics.median(host),
                "ratio": per_frame / one_shot,
                "pushes only ratio": push_per_frame / one_shot,
                "SNR dB vs one-shot": float(snr),
                "samples differing": int((audio != ref).sum()),
            }
        )
    return rows


def stream_run(model, prefix, frames: int, first: int, steady: int) -> dict:
    """One streamed request; host timestamps of every decode step (the ``callback``, on the engine's thread)."""
    marks = []
    start, stepped = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def callback(frame, step, max_steps):
        if not marks:
            stepped.record()  # on the engine's stream, behind the prefill and the first step (only queued)
        marks.append(time.perf_counter())
        return True

    t0 = time.perf_counter()
    start.record()
    ttfa, n_samples = None, 0
    for chunk in model.generate(
        prefix,
        max_new_tokens=frames,
        progress_bar=False,
        stream=True,
        first_chunk_frames=first,
        chunk_frames=steady,
        callback=callback,
        logits_processor=no_eos(model),
    ):
        if ttfa is None and chunk.audio.shape[-1]:
            ttfa = time.perf_counter() - t0
        n_samples += chunk.audio.shape[-1]
    total = time.perf_counter() - t0
    # The engine reads the device only every few steps, so single gaps show queueing; average over the run.
    step = (marks[-1] - marks[0]) / (len(marks) - 1)
    return {
        "ttfa": ttfa,
        "prefill": start.elapsed_time(stepped) / 1000 - step,  # GPU span from the call to the first step's end, less it
        "step": step,
        "total": total,
        "audio_s": n_samples / 44100,
    }


def first_push_time(codec: DACAutoencoder, frames: int) -> float:
    """Seconds for the vocoder's first push of a stream (``frames`` frames from a fresh state)."""
    dec = StreamingDACDecoder(codec)
    codes = torch.randint(0, 1024, (1, 9, frames), device="cuda")

    def push():
        dec.reset()
        dec.push(codes)

    return cuda_time(push)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=300, help="frames per request (86 ≈ 1 s)")
    p.add_argument("--reps", type=int, default=10, help="requests per schedule for the TTFA percentiles")
    p.add_argument(
        "--schedules", default="1x1,1x2,1x16,2x4,2x8,2x16,4x16", help="first x steady chunk frames, comma-separated"
    )
    accel = p.add_mutually_exclusive_group()
    accel.add_argument(
        "--no-accel", action="store_true", help="eager torch ops, no CUDA graphs (default: fast ops + graphs)"
    )
    accel.add_argument("--gemv", action="store_true", help="also the CuTeDSL GEMV for the decode projections")
    args = p.parse_args()

    torch.manual_seed(0)
    codec = DACAutoencoder(DACConfig(), device="cuda")
    if not args.no_accel:
        from zonos_accel.triton import triton_backend

        use_backend(codec.dac, triton_backend())  # the vocoder's Triton ops, as use_accelerators gives it below
    print(table(vocoder_cost(codec, 256, [1, 2, 4, 8, 16, 32]), "Vocoder: streamed vs one-shot cost per frame"))

    model = random_model("hybrid", autoencoder=codec)
    model.use_accelerators(fast_ops=not args.no_accel, cuda_graphs=not args.no_accel, use_cute_gemv=args.gemv or None)
    prefix = torch.randn(2, 120, 2048, device="cuda", dtype=torch.bfloat16)
    stream_run(model, prefix, 30, 1, 1)  # warm-up: allocations, cuDNN/cuBLAS heuristics, graph capture

    lookahead = receptive_field(codec.dac.config).lookahead_frames
    rows = []
    for spec in args.schedules.split(","):
        first, steady = map(int, spec.split("x"))
        for _ in range(2):  # the vocoder captures a push's graph the second time its shape occurs
            stream_run(model, prefix, args.frames, first, steady)
        runs = [stream_run(model, prefix, args.frames, first, steady) for _ in range(args.reps)]
        ttfa = [r["ttfa"] for r in runs]
        prefill = statistics.median(r["prefill"] for r in runs)
        step = statistics.median(r["step"] for r in runs)
        push = first_push_time(codec, lookahead + first)
        bound = prefill + (9 + lookahead + first) * step + push
        rows.append(
            {
                "schedule": spec,
                "TTFA p50 ms": 1000 * percentile(ttfa, 50),
                "TTFA p90 ms": 1000 * percentile(ttfa, 90),
                "prefill ms": 1000 * prefill,
                "step ms": 1000 * step,
                "first vocoder push ms": 1000 * push,
                f"bound: prefill+(9+{lookahead}+first) steps+push ms": 1000 * bound,
                "RTF (audio s / wall s)": statistics.median(r["audio_s"] / r["total"] for r in runs),
            }
        )
    print(table(rows, f"Streaming, {args.frames} frames per request, {args.reps} requests per schedule"))
    accel = "off" if args.no_accel else "on, with use_cute_gemv" if args.gemv else "on"
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, accelerators {accel}")


if __name__ == "__main__":
    main()
