"""The fused decode GEMVs (``zonos_accel.triton.gemv``, behind ``fused_blocks``) against the op-by-op kernels they
replace, at the Zonos-v0.1-hybrid projections: does a Triton GEMV that loads its whole weight tile at once come near
the read bandwidth, and what does fusing the norm before it (and the activation after it) save?

Per problem, µs per call and % of the read bandwidth (the bytes the call must move: weight, input rows, output rows)
for: the fused GEMV; the op-by-op path with cuBLAS (our Triton add + LayerNorm, ``F.linear``, our SiLU·mul); the same
with the CuTeDSL GEMV (``use_cute_gemv``) where it is installed; and, for the plain projections, the fused GEMV with
no prologue against ``F.linear`` and the CuTeDSL GEMV alone. Each time is the median over CUDA-graph replays of a
graph that calls the problem on enough weight copies to rotate past the L2 (cold weights, as in a decode step),
divided by the calls. Every row checks its result against float64.

``--tiles`` and ``--warps`` sweep ``gemv.TILE_ELEMENTS`` and ``gemv.NUM_WARPS`` (the fused rows only).

    source .device/activate.sh && python3 benchmarks/fused_gemv.py [--rows 1,2,8,16] [--tiles 8192,16384,32768]
                                                                   [--warps 4,8]
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback

import torch
import torch.nn.functional as F
from gpu import environment, graph_us, read_bandwidth_gbs, report

from zonos import ops

# problem -> (N, K, what runs around it): "norm" (add + LayerNorm before), "glu" (and SiLU·mul after), "plain"
PROBLEMS = {
    "mamba in_proj + norm": (8512, 2048, "norm"),
    "attn qkv + norm": (3072, 2048, "norm"),
    "mlp fc1 + norm + GLU": (16384, 2048, "glu"),
    "mamba out_proj": (2048, 4096, "plain"),
    "attn out": (2048, 2048, "plain"),
    "mlp fc2": (2048, 8192, "plain"),
}
ROTATE_BYTES = 200e6  # > 3 × the 50-60 MB L2 of an H100 / H200


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return math.inf if not torch.isfinite(y).all() else ((y.double() - ref).norm() / ref.norm()).item()


def implementations(kind: str) -> dict:
    """name -> fn(x, residual, norm_weight, norm_bias, weight) -> output, for one problem kind."""
    from zonos_accel.triton import gemv, norm_linear
    from zonos_accel.triton.activations import silu_mul
    from zonos_accel.triton.norms import add_layer_norm

    linears = {"cuBLAS": F.linear}
    try:
        from zonos_accel.gemv import cute_gemv_backend

        linears["CuTeDSL GEMV"] = cute_gemv_backend().linear
    except (ImportError, RuntimeError) as e:
        print(f"CuTeDSL GEMV left out: {e}", file=sys.stderr)
    impls = {}
    if kind == "plain":
        impls["fused GEMV (no prologue)"] = lambda x, r, nw, nb, w: gemv.gemv(x, w)[0]
        for name, linear in linears.items():
            impls[name] = lambda x, r, nw, nb, w, linear=linear: linear(x, w)
        return impls
    fused = norm_linear.add_layer_norm_glu if kind == "glu" else norm_linear.add_layer_norm_linear
    impls["fused GEMV"] = lambda x, r, nw, nb, w: fused(x, r, nw, nb, 1e-5, w)[0]
    for name, linear in linears.items():

        def op_by_op(x, r, nw, nb, w, linear=linear):
            y = linear(add_layer_norm(x, r, nw, nb, 1e-5)[0], w)
            return silu_mul(y) if kind == "glu" else y

        impls[f"op by op, {name}"] = op_by_op
    return impls


def reference(kind: str, x, r, nw, nb, w) -> torch.Tensor:
    args = [t.double() for t in (x, r, nw, nb, w)]
    if kind == "plain":
        return args[0] @ args[4].T
    op = ops.add_layer_norm_glu if kind == "glu" else ops.add_layer_norm_linear
    return op(args[0], args[1], args[2], args[3], 1e-5, args[4])[0]


def measure(rows: int, bandwidth: float, sweep: list[tuple[int, int]]) -> list[list]:
    from zonos_accel.triton import gemv

    table = []
    for problem, (n, k, kind) in PROBLEMS.items():
        copies = max(2, math.ceil(ROTATE_BYTES / (n * k * 2)))
        weights = [(torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16) for _ in range(copies)]
        x, r = (torch.randn(rows, k, device="cuda").to(torch.bfloat16) for _ in range(2))
        nw = (1 + 0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
        nb = (0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
        out_n = n // 2 if kind == "glu" else n
        nbytes = (n * k + (2 if kind != "plain" else 1) * rows * k + rows * out_n) * 2
        ref = reference(kind, x, r, nw, nb, weights[0])
        for name, fn in implementations(kind).items():
            configs = sweep if name.startswith("fused") else [(gemv.TILE_ELEMENTS, gemv.NUM_WARPS)]
            for tiles, warps in configs:
                saved = gemv.TILE_ELEMENTS, gemv.NUM_WARPS
                gemv.TILE_ELEMENTS, gemv.NUM_WARPS = tiles, warps
                label = f"{name} ({tiles}, {warps} warps)" if name.startswith("fused") else name
                try:
                    err = rel(fn(x, r, nw, nb, weights[0]), ref)
                    inputs = (x, r, nw, nb)
                    us = graph_us([lambda w=w, fn=fn, inputs=inputs: fn(*inputs, w) for w in weights])
                    pct = nbytes / (us * 1e-6) / bandwidth * 100
                    table.append([problem, rows, label, f"{us:.2f}", f"{pct:.1f}%", f"{err:.2e}"])
                except Exception:
                    traceback.print_exc()
                    table.append([problem, rows, label, "failed", "", ""])
                finally:
                    gemv.TILE_ELEMENTS, gemv.NUM_WARPS = saved
        del weights
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2", help="comma-separated rows (batch × CFG), each ≤ gemv.MAX_ROWS")
    parser.add_argument("--tiles", default=None, help="comma-separated gemv.TILE_ELEMENTS values (default: current)")
    parser.add_argument("--warps", default=None, help="comma-separated gemv.NUM_WARPS values (default: current)")
    args = parser.parse_args()
    from zonos_accel.triton import gemv

    tiles = [int(v) for v in args.tiles.split(",")] if args.tiles else [gemv.TILE_ELEMENTS]
    warps = [int(v) for v in args.warps.split(",")] if args.warps else [gemv.NUM_WARPS]
    sweep = [(t, w) for t in tiles for w in warps]
    print(environment())
    bandwidth = read_bandwidth_gbs() * 1e9
    for rows in (int(v) for v in args.rows.split(",")):
        title = f"decode projections, {rows} rows: µs per call, % of {bandwidth / 1e9:.0f} GB/s read, rel. error"
        header = ["problem", "rows", "implementation", "µs", "% read", "rel L2"]
        print(report(title, header, measure(rows, bandwidth, sweep)))


if __name__ == "__main__":
    main()
