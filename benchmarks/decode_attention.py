"""Decode attention against the KV cache at Zonos-v0.1-hybrid shapes (batch 2 = batch 1 with CFG, 16 query
heads, 4 kv heads, head 128, max_seqlen 4096, bf16): our split-K Triton kernel for a sweep of its tiling
(rows per split, rows per loop iteration, warps) against the masked SDPA reference, at several positions.

Times are CUDA-graph replays of 50 back-to-back calls (µs per call, median of 5 replays), the way the decode
step runs them; the cache rows read are L2-resident, so this is latency, not bandwidth.

    source .device/activate.sh && python3 benchmarks/decode_attention.py [--positions 226,1000,2700]
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch
from gpu import environment, report

import zonos_accel.triton.attention as fast
from zonos import ops

CALLS = 50


def replay_us(fn) -> float:
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times[1:])


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", default="226,1000,2700")
    ap.add_argument("--chunks", default="64,128,256")
    ap.add_argument("--blocks", default="32,64")
    ap.add_argument("--warps", default="2,4,8")
    args = ap.parse_args()
    print(environment())
    b, hq, hkv, d, max_seqlen = 2, 16, 4, 128, 4096
    gen = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(b, 1, hq, d, device="cuda", generator=gen).to(torch.bfloat16)
    k = torch.randn(b, max_seqlen, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(b, max_seqlen, hkv, d, device="cuda", generator=gen).to(torch.bfloat16)
    positions = [int(p) for p in args.positions.split(",")]
    defaults = (fast.CHUNK, fast.BLOCK_S, fast.SPLIT_WARPS)
    rows = []
    for pos in positions:
        position = torch.tensor(pos, device="cuda")
        ref = ops.decode_attention(q, k, v, position)
        rows.append(
            [
                pos,
                "SDPA reference (masked cache)",
                f"{replay_us(lambda p=position: ops.decode_attention(q, k, v, p)):.2f}",
                "",
            ]
        )
        for chunk, block, warps in itertools.product(
            *(map(int, a.split(",")) for a in (args.chunks, args.blocks, args.warps))
        ):
            if block > chunk:
                continue
            fast.CHUNK, fast.BLOCK_S, fast.SPLIT_WARPS = chunk, block, warps
            err = ((fast.decode_attention(q, k, v, position).float() - ref.float()).norm() / ref.float().norm()).item()
            mark = " (default)" if (chunk, block, warps) == defaults else ""
            us = replay_us(lambda p=position: fast.decode_attention(q, k, v, p))
            rows.append([pos, f"ours chunk {chunk}, block {block}, {warps} warps{mark}", f"{us:.2f}", f"{err:.1e}"])
        fast.CHUNK, fast.BLOCK_S, fast.SPLIT_WARPS = defaults
    print(report("Decode attention, µs per call", ["position", "kernel", "µs", "rel. error vs SDPA"], rows))


if __name__ == "__main__":
    main()
