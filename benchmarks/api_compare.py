"""The public API's speed at batch 1, for comparing two versions of the code side by side in one run.

Uses only what every version offers (``benchmarks.common.random_model``, ``Zonos.generate`` one-shot and
streamed, ``use_cute_gemv``), so the same script measures the tree it runs in and, with ``PYTHONPATH`` pointing
at another checkout, that one:

    python benchmarks/api_compare.py [--gemv] [--frames 200] [--reps 5]
    PYTHONPATH=/path/to/other/checkout python /path/to/this/benchmarks/api_compare.py ...

Reports: wall per decode frame (the difference of two one-shot lengths, so prefill and the fixed costs cancel),
GPU kernel time per frame (torch.profiler's CUDA kernel total over a one-shot run, divided by its steps),
prefill of a 120-token prefix (a 1-frame request minus its 8 decode steps), and streamed time to first audio
p50/p90. Real-size Zonos-v0.1-hybrid with random bf16 weights, EOS suppressed.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import torch

from benchmarks.common import percentile, random_model


def _suppressor(model):
    """generate() keyword arguments that keep codebook 0 from sampling EOS, in whichever way this version allows."""
    if "logits_processor" in inspect.signature(model.generate).parameters:

        def no_eos(logits, step):
            logits[:, 0, model.eos_token_id] = float("-inf")
            return logits

        return {"logits_processor": no_eos}
    from benchmarks.common import suppress_eos  # versions before the logits_processor hook patch the model

    suppress_eos(model)
    return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gemv", action="store_true", help="load with use_cute_gemv=True")
    ap.add_argument(
        "--no-fused-sampling", action="store_true", help="use_accelerators(fused_sampling=False) (this tree)"
    )
    ap.add_argument("--frames", type=int, default=200, help="frames of the longer one-shot run")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each measurement (median)")
    ap.add_argument("--label", default="", help="a name for this version in the table")
    ap.add_argument("--profile", action="store_true", help="also print torch.profiler's table of a 1-frame request")
    args = ap.parse_args()

    model = random_model("hybrid")
    flags = {"use_cute_gemv": True} if args.gemv else {}
    if args.no_fused_sampling:
        flags["fused_sampling"] = False
    model.use_accelerators(**flags)
    from zonos.codec.autoencoder import DACAutoencoder
    from zonos.codec.dac import DACConfig

    model.autoencoder = DACAutoencoder(DACConfig(), device="cuda")
    extra = _suppressor(model)
    g = torch.Generator("cuda").manual_seed(0)
    prefix = torch.randn(2, 120, model.config.backbone.d_model, device="cuda", generator=g).to(model.dtype)
    model.warmup(progress_bar=False)

    def one_shot(frames: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(prefix, max_new_tokens=frames, progress_bar=False, **extra)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    short, long = 20, args.frames
    for n in (short, long, 1):
        one_shot(n)  # capture whatever these lengths need
    t_short = statistics.median(one_shot(short) for _ in range(args.reps))
    t_long = statistics.median(one_shot(long) for _ in range(args.reps))
    wall = (t_long - t_short) / (long - short)
    t_one = statistics.median(one_shot(1) for _ in range(args.reps))
    prefill = t_one - 8 * wall  # a 1-frame request runs the prefill and 8 decode steps

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.generate(prefix, max_new_tokens=long, progress_bar=False, **extra)
        torch.cuda.synchronize()
    kernel_us = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    kernels = sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")
    steps = long + 7
    gpu = kernel_us / 1e6 / steps

    ttfa = []
    for _ in range(max(args.reps, 10)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        stream = model.generate(prefix, max_new_tokens=60, progress_bar=False, stream=True, **extra)
        next(iter(stream))
        ttfa.append(time.perf_counter() - t0)
        stream.close()
    if args.profile:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            one_shot(1)
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30))
    name = args.label or "this tree"
    print(
        "\n| version | gemv | wall ms/frame | GPU ms/frame (kernels/step) | prefill 120 tok ms | TTFA p50 ms "
        "| TTFA p90 ms |\n"
        f"|---|---|---|---|---|---|---|\n"
        f"| {name} | {args.gemv} | {wall * 1e3:.3f} | {gpu * 1e3:.3f} ({kernels / steps:.0f}) | {prefill * 1e3:.2f} | "
        f"{percentile(ttfa, 50) * 1e3:.1f} | {percentile(ttfa, 90) * 1e3:.1f} |"
    )


if __name__ == "__main__":
    main()
