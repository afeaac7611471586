"""Prefill of Zonos-v0.1-hybrid (random bf16 weights) with CFG (backbone batch 2) at conditioning lengths
~60, ~120 and ~1000 tokens: wall ms (host clock around a synchronized call) and GPU ms (CUDA events),
medians of 10 after warm-up, for the torch reference ops and the Triton fast paths, each eager and with the
prefill's CUDA graphs (``zonos_accel.graphs.GraphCache.prefill``: fixed-size pieces replayed at the device
position), on a 2-row inference state as the engine's staging state. Graphs are captured before timing
(``GraphCache.prepare_prefill``); their count and capture time are printed, and so is how far the graphed
logits are from the eager ones (same ops, same prefix).

    python3 benchmarks/prefill.py [--lengths 60,120,1000] [--ops torch,triton] [--graphs off,on]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from gpu import environment, real_size_model, report, use_ops

from zonos.codebook_pattern import N_CODEBOOKS
from zonos_accel.graphs import GraphCache, prefill_pieces


def prefill(model, prefix: torch.Tensor, state, graphs: GraphCache | None) -> torch.Tensor:
    """What the engine's prefill computes for one request on a reset ``state``: the backbone over the prefix and
    the first code column (eager, or as ``graphs``' pieces), then the guided logits of the last position."""
    state.reset()
    codes = torch.full((1, N_CODEBOOKS, 1), model.masked_token_id, device="cuda")
    hidden = torch.cat([prefix, model.embed_codes(codes).expand(prefix.shape[0], -1, -1)], dim=1)
    out = model.backbone(hidden, state) if graphs is None else graphs.prefill(model.backbone, hidden, state)
    return model.guided_logits(out[:, -1], torch.full((1,), 2.0, device="cuda"))


def time_prefill(model, prefix, state, graphs, repeat: int = 10, warmup: int = 2) -> tuple[float, float, torch.Tensor]:
    """Median wall ms, median GPU ms, and the logits of the last call (run on the current stream)."""
    walls, gpus = [], []
    for i in range(warmup + repeat):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        logits = prefill(model, prefix, state, graphs)
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            walls.append((time.perf_counter() - t0) * 1e3)
            gpus.append(start.elapsed_time(end))
    return statistics.median(walls), statistics.median(gpus), logits


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="60,120,1000")
    ap.add_argument(
        "--ops", default="torch,triton", help="comma-separated, from torch, triton, triton-nopdl, triton+gemv"
    )
    ap.add_argument("--graphs", default="off,on")
    args = ap.parse_args()
    print(environment())
    model = real_size_model()
    gen = torch.Generator("cuda").manual_seed(2)
    lengths = [int(n) for n in args.lengths.split(",")]
    prefixes = {n: torch.randn(2, n, 2048, device="cuda", generator=gen).to(torch.bfloat16) for n in lengths}
    rows, notes = [], []
    state = model.backbone.allocate_inference_state(2, model.max_seqlen)
    side = torch.cuda.Stream()  # CUDA-graph capture needs a side stream, as the engine's
    for ops in args.ops.split(","):
        use_ops(model, ops, cuda_graphs=False)  # the backend only: these runs call the backbone themselves
        eager_logits = {}
        for graph_mode in args.graphs.split(","):
            graphs = GraphCache("cuda") if graph_mode == "on" else None
            for length in lengths:
                label = ops
                with torch.cuda.stream(side):
                    if graphs is not None:
                        label = f"{ops} + graphs"
                        before = graphs.captures
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        graphs.prepare_prefill(model.backbone, state, prefill_pieces(length + 1))
                        torch.cuda.synchronize()
                        notes.append(
                            f"{label}, {length} tokens: pieces {prefill_pieces(length + 1)}, "
                            f"{graphs.captures - before} new graphs captured in {time.perf_counter() - t0:.2f} s"
                        )
                    wall, gpu, logits = time_prefill(model, prefixes[length], state, graphs)
                if graphs is None:
                    eager_logits[length] = logits
                elif length in eager_logits:
                    ref, finite = eager_logits[length], torch.isfinite(eager_logits[length])
                    rel = (logits[finite] - ref[finite]).norm() / ref[finite].norm()
                    notes.append(f"{label}, {length} tokens: logits vs eager, relative difference {rel:.2e}")
                rows.append([label, length, length + 1, f"{wall:.2f}", f"{gpu:.2f}", f"{wall - gpu:.2f}"])
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
