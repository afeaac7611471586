"""Prefill of Zonos-v0.1-hybrid (random bf16 weights) with CFG (backbone batch 2) at conditioning lengths
~60, ~120 and ~1000 tokens: wall ms (host clock around a synchronized call) and GPU ms (CUDA events),
medians of 10 after warm-up, for the torch reference ops and the Triton fast paths.

    python3 benchmarks/prefill.py [--lengths 60,120,1000] [--ops torch,triton]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from gpu import environment, real_size_model, report, set_ops

from zonos.model import N_CODEBOOKS


def time_prefill(model, prefix, repeat: int = 10, warmup: int = 2) -> tuple[float, float]:
    state = model._inference_state(prefix.shape[0])
    codes = torch.full((1, N_CODEBOOKS, 1), model.masked_token_id, device="cuda")
    walls, gpus = [], []
    for i in range(warmup + repeat):
        state.reset()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        model._prefill(prefix, codes, state, 2.0)
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            walls.append((time.perf_counter() - t0) * 1e3)
            gpus.append(start.elapsed_time(end))
    return statistics.median(walls), statistics.median(gpus)


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="60,120,1000")
    ap.add_argument("--ops", default="torch,triton")
    args = ap.parse_args()
    print(environment())
    model = real_size_model()
    gen = torch.Generator("cuda").manual_seed(2)
    rows = []
    for ops in args.ops.split(","):
        set_ops(ops)
        for length in map(int, args.lengths.split(",")):
            prefix = torch.randn(2, length, 2048, device="cuda", generator=gen).to(torch.bfloat16)
            wall, gpu = time_prefill(model, prefix)
            rows.append([ops, length, length + 1, f"{wall:.2f}", f"{gpu:.2f}", f"{wall - gpu:.2f}"])
    set_ops("torch")
    print()
    print(
        report(
            "Prefill with CFG (backbone batch 2), Zonos-v0.1-hybrid random bf16",
            ["ops", "prefix tokens", "backbone tokens", "wall ms", "GPU ms", "wall − GPU ms"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
