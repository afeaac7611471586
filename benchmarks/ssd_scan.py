"""The Mamba2 SSD prefill scan at Zonos-v0.1-hybrid shapes: ours in CuTeDSL (``zonos_accel.ssd``, use_cute_scan),
ours in Triton (``zonos_accel.triton.ssd_scan``, the fast ops' scan without it), mamba_ssm's Triton combined scan
(when importable) and the torch chunked reference, in one run.

Shapes: x (b, L, 64 heads, 64) and B, C (b, L, 1 group, 128) as bf16 views of one conv output (the mixer's
layout), fp32 step sizes and decay rates, D, a bf16 initial state (the decode cache), chunk 256. Each time is
the median of CUDA-event timings over CUDA-graph replays of one scan (inputs L2-resident, as after the conv that
writes them). A time below what the bytes allow at the HBM peak (4.8 TB/s) is rejected: the kernel did not run
in the graph. Each row also gives y's and the final state's relative L2 error against the float64 reference
(equal to the token-by-token recurrence to 1e-10: tests/test_ssd.py).

    source .device/activate.sh && python3 benchmarks/ssd_scan.py [--batch 2] [--lengths 100,256,1024,4096]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback

import torch
from gpu import environment, event_times, report

from zonos import ops

HEADS, HEADDIM, STATE, CHUNK = 64, 64, 128, 256
PEAK_GBS = 4800.0


def inputs(b: int, length: int, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h, p, n = HEADS, HEADDIM, STATE
    xbc = torch.randn(b, length, h * p + 2 * n, device="cuda", generator=gen).to(torch.bfloat16)
    x = xbc[..., : h * p].unflatten(-1, (h, p))
    B = xbc[..., h * p : h * p + n].unflatten(-1, (1, n))
    C = xbc[..., h * p + n :].unflatten(-1, (1, n))
    dt = torch.nn.functional.softplus(torch.randn(b, length, h, device="cuda", generator=gen) - 2)
    A = -torch.exp(torch.empty(h, device="cuda").uniform_(-3, 2, generator=gen))
    D = torch.randn(h, device="cuda", generator=gen)
    s0 = (0.5 * torch.randn(b, h, p, n, device="cuda", generator=gen)).to(torch.bfloat16)
    return x, dt, A, B, C, D, s0


def floor_ms(b: int, length: int) -> float:
    """Bytes one scan must move: x, B, C, dt read, y written, the bf16 initial state read, the fp32 state written."""
    tokens = b * length
    moved = tokens * (2 * HEADS * HEADDIM * 2 + 2 * STATE * 2 + HEADS * 4) + b * HEADS * HEADDIM * STATE * (2 + 4)
    return moved / (PEAK_GBS * 1e9) * 1e3


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("nan")
    return ((out.double() - ref).norm() / ref.norm()).item()


def implementations() -> dict:
    impls = {"torch": ops.ssd_scan}
    try:
        from zonos_accel.triton.mamba import mamba_module
        from zonos_accel.triton.mamba import ssd_scan as mamba_scan

        mamba_module("ssd_combined")
        impls["mamba_ssm"] = mamba_scan
    except ImportError as e:
        print(f"mamba_ssm left out: {e}", file=sys.stderr)
    import zonos_accel.ssd

    def cute(batched_loads: bool):
        def scan(*args, **kwargs):
            zonos_accel.ssd.BATCHED_LOADS = batched_loads  # read when the launch is built (captured)
            return zonos_accel.ssd.ssd_scan(*args, **kwargs)

        return scan

    impls["cute"] = cute(False)
    impls["cute batched"] = cute(True)  # cp.async for C and B, x and S0 loads batched
    from zonos_accel.triton.ssd_scan import ssd_scan as triton_scan

    impls["triton (ours)"] = triton_scan
    return impls


def measure(fn, args: tuple, repeat: int) -> tuple[float, tuple]:
    """(median ms over graph replays, outputs of the last replay)."""
    fn(*args[:5], CHUNK, D=args[5], initial_state=args[6])  # compile / autotune outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args[:5], CHUNK, D=args[5], initial_state=args[6])
    ms = statistics.median(event_times(graph.replay, repeat=repeat, warmup=5))
    return ms, out


def diagnose(b: int) -> None:
    """Where the CuTeDSL scan departs from the float64 reference: y's error per 16-token block and the final
    state's, for each term alone (only the initial state: x = 0; no initial state) and together."""
    from zonos_accel.ssd import ssd_scan

    for length in (16, 100, 256, 300):
        x, dt, A, B, C, D, s0 = inputs(b, length, seed=7)
        cases = {"init only (x=0)": (torch.zeros_like(x), s0), "no init": (x, None), "both": (x, s0)}
        for name, (xc, init) in cases.items():
            x64 = (t.double() for t in (xc, dt, A, B, C))
            init64 = None if init is None else init.double()
            y_ref, s_ref = ops.ssd_scan(*x64, CHUNK, D=D.double(), initial_state=init64)
            y, s = ssd_scan(xc, dt, A, B, C, CHUNK, D=D, initial_state=init)
            torch.cuda.synchronize()
            blocks = [f"{rel(y[:, t : t + 16], y_ref[:, t : t + 16]):.1e}" for t in range(0, length, 16)]
            print(f"L={length} {name}: state {rel(s, s_ref):.2e}, y {rel(y, y_ref):.2e}, y per block {blocks}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--lengths", default="100,256,1024,4096")
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--diagnose", action="store_true", help="per-term, per-block errors of ours instead")
    args = parser.parse_args()
    print(environment())
    if args.diagnose:
        diagnose(args.batch)
        return
    impls = implementations()
    rows = []
    for length in map(int, args.lengths.split(",")):
        data = inputs(args.batch, length, seed=length)
        x, dt, A, B, C, D, s0 = data
        x64 = (t.double() for t in (x, dt, A, B, C))
        y_ref, s_ref = ops.ssd_scan(*x64, CHUNK, D=D.double(), initial_state=s0.double())
        floor = floor_ms(args.batch, length)
        times = {}
        for name, fn in impls.items():
            t0 = time.perf_counter()
            try:
                ms, (y, s) = measure(fn, data, args.repeat)
            except Exception:
                traceback.print_exc()
                rows.append([length, name, "failed", "", "", "", ""])
                continue
            first = time.perf_counter() - t0
            valid = ms >= floor
            times[name] = ms if valid else float("nan")
            rows.append(
                [
                    length,
                    name,
                    f"{ms:.4f}" if valid else f"rejected ({ms:.4f} < floor)",
                    f"{floor:.4f}",
                    f"{rel(y, y_ref):.2e}",
                    f"{rel(s, s_ref):.2e}",
                    f"{first:.1f}",
                ]
            )
        for ours in ("cute", "cute batched"):
            if ours in times and "mamba_ssm" in times:
                rows.append([length, f"mamba_ssm / {ours}", f"{times['mamba_ssm'] / times[ours]:.2f}x", "", "", "", ""])
            if ours in times:
                launches = -(-length // CHUNK)
                per_launch = f"{times[ours] / launches:.4f} ({launches} launches)"
                rows.append([length, f"{ours} per launch", per_launch, "", "", "", ""])
        print(rows[-1], flush=True)
    header = ["L", "scan", "ms (graph replay)", "byte floor ms", "y rel L2", "state rel L2", "first call s"]
    title = f"SSD scan, batch {args.batch}, 64 heads x 64, state 128, chunk 256, bf16 initial state"
    print(report(title, header, rows))


if __name__ == "__main__":
    main()
