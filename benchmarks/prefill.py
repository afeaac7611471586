"""Prefill of Zonos-v0.1-hybrid (random bf16 weights) with CFG (backbone batch 2) at conditioning lengths
~60, ~120 and ~1000 tokens: wall ms (host clock around a synchronized call) and GPU ms (CUDA events),
medians of 10 after warm-up, for the torch reference ops and the Triton fast paths, each eager and with the
prefill's CUDA graphs (``zonos_accel.graph.CudaGraphPrefill``: fixed-size pieces replayed at the device
position). Graphs are captured before timing (``runner.prepare``); their count and capture time are printed,
and so is how far the graphed logits are from the eager ones (same ops, same prefix).

    python3 benchmarks/prefill.py [--lengths 60,120,1000] [--ops torch,triton] [--graphs off,on]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from gpu import environment, real_size_model, report, set_ops

from zonos.model import N_CODEBOOKS
from zonos_accel.graph import disable_cuda_graphs, enable_cuda_graphs, prefill_pieces


def time_prefill(model, prefix, repeat: int = 10, warmup: int = 2) -> tuple[float, float, torch.Tensor]:
    """Median wall ms, median GPU ms, and the logits of the last call."""
    state = model._inference_state(prefix.shape[0])
    codes = torch.full((1, N_CODEBOOKS, 1), model.masked_token_id, device="cuda")
    walls, gpus = [], []
    for i in range(warmup + repeat):
        state.reset()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        logits = model._prefill(prefix, codes, state, 2.0)
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            walls.append((time.perf_counter() - t0) * 1e3)
            gpus.append(start.elapsed_time(end))
    return statistics.median(walls), statistics.median(gpus), logits


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="60,120,1000")
    ap.add_argument("--ops", default="torch,triton")
    ap.add_argument("--graphs", default="off,on")
    args = ap.parse_args()
    print(environment())
    model = real_size_model()
    gen = torch.Generator("cuda").manual_seed(2)
    lengths = [int(n) for n in args.lengths.split(",")]
    prefixes = {n: torch.randn(2, n, 2048, device="cuda", generator=gen).to(torch.bfloat16) for n in lengths}
    rows, notes = [], []
    for ops in args.ops.split(","):
        set_ops(ops)
        eager_logits = {}
        for graphs in args.graphs.split(","):
            if graphs == "on":
                enable_cuda_graphs(model)
                runner = model._backbone_prefill
            else:
                disable_cuda_graphs(model)
            for length in lengths:
                label = ops
                if graphs == "on":
                    label = f"{ops} + graphs"
                    before = runner.captures
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    runner.prepare(2, [length + 1])  # what the first request of this length would capture
                    torch.cuda.synchronize()
                    notes.append(
                        f"{label}, {length} tokens: pieces {prefill_pieces(length + 1)}, "
                        f"{runner.captures - before} new graphs captured in {time.perf_counter() - t0:.2f} s"
                    )
                wall, gpu, logits = time_prefill(model, prefixes[length])
                if graphs != "on":
                    eager_logits[length] = logits
                elif length in eager_logits:
                    ref, finite = eager_logits[length], torch.isfinite(eager_logits[length])
                    rel = (logits[finite] - ref[finite]).norm() / ref[finite].norm()
                    notes.append(f"{label}, {length} tokens: logits vs eager, relative difference {rel:.2e}")
                rows.append([label, length, length + 1, f"{wall:.2f}", f"{gpu:.2f}", f"{wall - gpu:.2f}"])
        disable_cuda_graphs(model)
    set_ops("torch")
    print()
    print("\n".join(notes))
    print(
        report(
            "Prefill with CFG (backbone batch 2), Zonos-v0.1-hybrid random bf16",
            ["ops", "prefix tokens", "backbone tokens", "wall ms", "GPU ms", "wall − GPU ms"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
