"""CuTeDSL skinny GEMV (``zonos_accel.gemv``) against cuBLAS (``F.linear``) at the decode projections.

Every time is the median over CUDA-graph replays (CUDA events) of a graph that calls one projection on
enough copies of its weight to rotate past the 60 MB L2 (cold weights, as in a decode step), divided by
the number of calls. Bandwidth counts the bytes each call must move (weight, x, y); % is of the read
bandwidth measured in this run (a sum over 4 GiB). A time below what the bytes allow at the HBM3e peak
(4.8 TB/s) is rejected, not printed: such a kernel did not run in the graph (launched off the capture
stream). Each row also checks the result against float64, next to cuBLAS's own error.

Tables, each printed when done: (1) every projection shape × M ∈ {1, 2, 4, 8}, tuned split; (2) M = 16, past
the routing limit (MAX_ROWS); (3) every work split of ``candidate_configs`` (``--sweep fma``), ``mma_candidates``
(``--sweep mma``), ``occupancy_candidates`` (``--sweep occupancy``) or ``warps_candidates`` (``--sweep warps``) at
the ``--sweep-m`` values and for the ``--shapes`` named (default all), instead of (1) and (2), the best one per
problem listed for the ``TUNED`` table;
(4) the projections of one whole decode step (34 Mamba2 + 12 attention layers, M = 2, distinct weights)
through cuBLAS and ours, against the read floor.

    source .device/activate.sh && python3 benchmarks/gemv.py [--sweep fma|mma|occupancy|warps] [--sweep-m 1,2,4]
                                                             [--shapes "mamba in_proj,mlp fc2"]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from dataclasses import replace

import torch
import torch.nn.functional as F
from gpu import environment, graph_us, read_bandwidth_gbs, report

from zonos_accel.gemv import gemv
from zonos_accel.gemv.config import (
    MmaConfig,
    candidate_configs,
    fma_config,
    gemv_config,
    mma_candidates,
    occupancy_candidates,
    warps_candidates,
)

# Zonos-v0.1-hybrid projections (N, K) and how many a decode step runs.
SHAPES = {
    "mamba in_proj": (8512, 2048),
    "mamba out_proj": (2048, 4096),
    "attn qkv": (3072, 2048),
    "attn out": (2048, 2048),
    "mlp fc1": (16384, 2048),
    "mlp fc2": (2048, 8192),
    "heads (9 fused)": (9232, 2048),  # 9 · 1025 rows, zero-padded to a multiple of 16 as the model stacks them
}
MAMBA_LAYERS, ATTN_LAYERS = 34, 12
MAMBA_LAYER = ("mamba in_proj", "mamba out_proj")
ATTN_LAYER = ("attn qkv", "attn out", "mlp fc1", "mlp fc2")
STEP = [MAMBA_LAYER] * MAMBA_LAYERS + [ATTN_LAYER] * ATTN_LAYERS
ROTATE_BYTES = 200e6  # > 3 × the H200's 60 MB L2
PEAK_BYTES_PER_S = 4.8e12  # H200 HBM3e datasheet: nothing reads faster
rejected: list[str] = []


def weights_for(n: int, k: int, copies: int) -> list[torch.Tensor]:
    return [(torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16) for _ in range(copies)]


def checked(us: float, nbytes: float, what: str) -> float | None:
    """``us`` unless the bytes cannot physically move in that time (then record and drop it)."""
    floor = nbytes / PEAK_BYTES_PER_S * 1e6
    if us < floor:
        rejected.append(f"{what}: {us:.2f} µs is below the {floor:.2f} µs that {nbytes / 1e6:.1f} MB need at 4.8 TB/s")
        return None
    return us


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(y).all():
        return math.inf
    return ((y.double() - ref).norm() / ref.norm()).item()


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "rejected" if v is None else format(v, spec)


def measure(name: str, n: int, k: int, m: int, configs, bw: float) -> tuple[list, dict]:
    """One row per config (the first being cuBLAS's comparison): µs, GB/s, % of read, ×, errors."""
    nbytes = (n * k + m * k + m * n) * 2
    ws = weights_for(n, k, max(2, math.ceil(ROTATE_BYTES / (n * k * 2))))
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    ref = x.double() @ ws[0].double().T
    err_cublas = rel_err(F.linear(x, ws[0]), ref)
    t_cublas = checked(graph_us([lambda w=w: F.linear(x, w) for w in ws]), nbytes, f"{name} M={m} cuBLAS")
    rows, times = [], {}
    for cfg in configs:
        try:
            y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            t0 = time.perf_counter()
            gemv(x, ws[0], out=y, config=cfg)
            compile_s = time.perf_counter() - t0
            err = rel_err(y, ref)
            t = checked(graph_us([lambda w=w, c=cfg: gemv(x, w, config=c) for w in ws]), nbytes, f"{name} M={m} {cfg}")
        except Exception:  # keep the other rows: one bad split must not lose the run
            traceback.print_exc()
            rows.append([name, f"{n}×{k}", m, cfg_label(cfg), fmt(t_cublas), "error", "", "", "", "", "", ""])
            continue
        times[cfg] = t
        rows.append(
            [
                name,
                f"{n}×{k}",
                m,
                cfg_label(cfg),
                fmt(t_cublas),
                fmt(t),
                fmt(None if t is None else nbytes / t / 1e3, ".0f"),
                fmt(None if t is None else 100 * nbytes / t / 1e3 / bw, ".1f"),
                fmt(None if t_cublas is None else 100 * nbytes / t_cublas / 1e3 / bw, ".1f"),
                fmt(None if t is None or t_cublas is None else t_cublas / t),
                f"{err:.2e} / {err_cublas:.2e}",
                f"{compile_s:.1f}",
            ]
        )
    del ws
    return rows, {"cublas": t_cublas, **times}


def cfg_label(cfg) -> str:
    flags = [f"s{cfg.splits}"] if cfg.splits > 1 else []
    flags += [] if cfg.hoist_loads else ["interleaved"]
    flags += (["nc"] if cfg.stream_loads else []) + (["pdl"] if cfg.pdl else [])
    flags += [f"min{cfg.min_ctas}"] if cfg.min_ctas else []
    if isinstance(cfg, MmaConfig):
        tile = f"mma t{cfg.tiles}{'h' if cfg.half else ''} k{cfg.ksteps}"
    else:
        tile = f"v{cfg.vecs} r{cfg.rows}"
    return " ".join([f"{tile} wk{cfg.warps_k} wn{cfg.warps_n}", *flags])


HEADER = [
    "shape",
    "N×K",
    "M",
    "split",
    "cuBLAS µs",
    "ours µs",
    "ours GB/s",
    "ours % read",
    "cuBLAS % read",
    "speedup",
    "rel err ours / cuBLAS",
    "first call s",
]


def step_table(bw: float, best: dict) -> list:
    """The projections of one decode step (M = 2, distinct weights, one graph) through cuBLAS and ours."""
    weights, xs = [], {}
    for layer in STEP:
        for name in layer:
            n, k = SHAPES[name]
            weights.append((name, (torch.randn(n, k, device="cuda") * k**-0.5).to(torch.bfloat16)))
            xs.setdefault(k, torch.randn(2, k, device="cuda").to(torch.bfloat16))
    nbytes = sum(w.numel() * 2 for _, w in weights)
    no_pdl = {name: replace(gemv_config(2, n, k), pdl=False) for name, (n, k) in SHAPES.items()}
    floor_ms = nbytes / (bw * 1e9) * 1e3
    runs = {
        "cuBLAS": [lambda w=w: F.linear(xs[w.shape[1]], w) for _, w in weights],
        "ours (default: tuned splits, pdl)": [lambda w=w: gemv(xs[w.shape[1]], w) for _, w in weights],
        "ours (default splits, no pdl)": [
            lambda w=w, c=no_pdl[nm]: gemv(xs[w.shape[1]], w, config=c) for nm, w in weights
        ],
    }
    if best:  # the shapes not swept keep their tuned split
        swept = [(best.get(nm), w) for nm, w in weights]
        runs["ours (best swept splits)"] = [lambda w=w, c=c: gemv(xs[w.shape[1]], w, config=c) for c, w in swept]
    rows = []
    for label, calls in runs.items():
        try:
            for c in calls:
                c()  # compile every shape outside the capture
            us = checked(graph_us(calls) * len(calls), nbytes, f"step {label}")
        except Exception:
            traceback.print_exc()
            rows.append([label, len(calls), f"{nbytes / 1e9:.3f}", "error", f"{floor_ms:.3f}", "", ""])
            continue
        ms = None if us is None else us / 1e3
        rows.append(
            [
                label,
                len(calls),
                f"{nbytes / 1e9:.3f}",
                fmt(ms, ".3f"),
                f"{floor_ms:.3f}",
                fmt(None if ms is None else ms / floor_ms, ".2f"),
                fmt(None if ms is None else 100 * floor_ms / ms, ".1f"),
            ]
        )
    return rows


def m_values(text: str) -> list[int]:
    """``--sweep-m``: comma-separated positive ints."""
    values = [int(x) for x in text.split(",")]
    if min(values) < 1:
        raise ValueError(text)
    return values


def shape_names(text: str) -> list[str]:
    """``--shapes``: comma-separated keys of SHAPES."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in SHAPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown shapes {unknown}; choose from {list(SHAPES)}")
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sweep",
        choices=["fma", "mma", "occupancy", "warps"],
        help="instead of tables 1 and 2, time every split of one kernel (candidate_configs: FMA, mma_candidates: "
        "tensor cores) against the tuned default and list the best per problem; occupancy: the tuned split and "
        "the FMA v1 r8 split with 4-8 CTAs per SM imposed (occupancy_candidates); warps: the tuned split and the FMA "
        "v1 r8 and v2 r4 splits with up to 1, 2 or 4 warps along K (warps_candidates)",
    )
    ap.add_argument(
        "--sweep-m",
        type=m_values,
        default=[2],
        help="comma-separated M values to sweep (default 2, the decode with CFG; the step table then adds a row "
        "with M = 2's best splits)",
    )
    ap.add_argument(
        "--shapes",
        type=shape_names,
        default=list(SHAPES),
        help=f"comma-separated projections a sweep times (default all: {', '.join(SHAPES)})",
    )
    args = ap.parse_args()
    start = time.perf_counter()
    torch.manual_seed(0)
    print(environment())
    bw = read_bandwidth_gbs()
    print(f"read bandwidth (sum over 4 GiB of bf16): {bw:.0f} GB/s")

    if not args.sweep:
        rows = []
        for name, (n, k) in SHAPES.items():
            for m in (1, 2, 4, 8):
                rows += measure(name, n, k, m, [gemv_config(m, n, k)], bw)[0]
        print(report("Projection shapes, default split (median of graph replays, cold weights)", HEADER, rows))

        rows = []
        for name in ("mamba in_proj", "attn out"):
            n, k = SHAPES[name]
            configs = [fma_config(16, n, k)]
            rows += measure(name, n, k, 16, configs, bw)[0]
        print(report("Routing limit: M = 16 (decode with batching; stays on cuBLAS)", HEADER, rows))

    best, tuned_lines = {}, []
    for m in args.sweep_m if args.sweep else []:
        rows = []
        for name in args.shapes:
            n, k = SHAPES[name]
            if args.sweep == "mma":
                configs = [gemv_config(m, n, k), *mma_candidates(m, n, k)]
            elif args.sweep == "occupancy":
                configs = occupancy_candidates(m, n, k)
            elif args.sweep == "warps":
                configs = warps_candidates(m, n, k)
            else:
                configs = candidate_configs(m, n, k)
            shape_rows, times = measure(name, n, k, m, configs, bw)
            timed = {c: t for c, t in times.items() if c != "cublas" and t is not None}
            winner = min(timed, key=timed.get) if timed else gemv_config(m, n, k)
            for r in shape_rows:
                r.append("best" if r[3] == cfg_label(winner) else "")
            rows += shape_rows
            if m == 2:
                best[name] = winner
            if timed:
                entry = f"({m}, {n}, {k}): {cfg_label(winner)},"
                tuned_lines.append(f"    {entry}  # {name}: {timed[winner]:.2f} µs ({cfg_label(winner)})")
        title = f"Work splits at M = {m} ({args.sweep} kernel and the tuned default; TUNED should pick 'best')"
        print(report(title, HEADER + [""], rows))
    if tuned_lines:
        print("\nBest split per problem (M, N, K):")
        print("\n".join(tuned_lines))

    step_header = ["path", "calls", "GB", "ms per step", "floor ms", "× floor", "% of read bandwidth"]
    title = f"Projections of one decode step ({MAMBA_LAYERS} Mamba2 + {ATTN_LAYERS} attention layers, M = 2)"
    print(report(title, step_header, step_table(bw, best)))

    print(f"total {time.perf_counter() - start:.0f} s")
    if rejected:
        print("\nREJECTED (faster than the bytes allow; the kernel did not run in the graph):")
        print("\n".join(rejected))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
