"""The decode step's Mamba2 ops at Zonos-v0.1-hybrid shapes: our Triton state update (``ssd_step``) and gated
RMSNorm against mamba_ssm's kernels (when importable) and the torch references, in one run.

As in a decode step, one CUDA graph runs the op once per Mamba2 layer (34), each on its own state / inputs, so
the states are as cold as in the step (34 × the state is past the 60 MB L2 from batch 2 on); the time is the
median CUDA-event time of a replay divided by 34. Each row checks the result against float64.

    source .device/activate.sh && python3 benchmarks/mamba_decode_ops.py [--batches 1,2,16,512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import traceback

import torch
from gpu import environment, event_times, report

from zonos import ops

LAYERS, HEADS, HEADDIM, STATE, D_INNER = 34, 64, 64, 128, 4096


def state_update_impls() -> dict:
    impls = {"torch": ops.ssd_step}
    try:
        from zonos_accel.triton.mamba import mamba_module
        from zonos_accel.triton.mamba import ssd_step as mamba_step

        mamba_module("selective_state_update")
        impls["mamba_ssm"] = mamba_step
    except ImportError as e:
        print(f"mamba_ssm left out: {e}", file=sys.stderr)
    from zonos_accel.triton.state_update import ssd_step

    impls["ours"] = ssd_step
    return impls


def norm_impls() -> dict:
    impls = {"torch": ops.gated_rms_norm}
    try:
        from zonos_accel.triton.mamba import gated_rms_norm as mamba_norm
        from zonos_accel.triton.mamba import mamba_module

        mamba_module("layernorm_gated")
        impls["mamba_ssm"] = mamba_norm
    except ImportError as e:
        print(f"mamba_ssm left out: {e}", file=sys.stderr)
    from zonos_accel.triton.gated_norm import gated_rms_norm

    impls["ours"] = gated_rms_norm
    return impls


def per_call_ms(calls, repeat: int) -> float:
    for c in calls:
        c()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    return statistics.median(event_times(graph.replay, repeat=repeat, warmup=3)) / len(calls)


def rel(out, ref) -> float:
    if not torch.isfinite(out).all():
        return float("nan")
    return ((out.double() - ref).norm() / ref.norm()).item()


def bench_state_update(batches, repeat) -> list[list]:
    rows = []
    h, p, n = HEADS, HEADDIM, STATE
    for b in batches:
        layers = LAYERS if b <= 64 else 4  # 4 layers of 512 slots are already 1 GB of state
        xbc = torch.randn(layers, b, h * p + 2 * n, device="cuda").to(torch.bfloat16)
        dt = torch.randn(layers, b, h, device="cuda").to(torch.bfloat16)
        A = -torch.exp(torch.empty(h, device="cuda").uniform_(-3, 2))
        D, dt_bias = torch.randn(h, device="cuda"), torch.randn(h, device="cuda") - 3
        base = torch.randn(b, h, p, n, device="cuda").to(torch.bfloat16)
        for name, fn in state_update_impls().items():
            states = [base.clone() for _ in range(layers)]

            def call(i, fn=fn, states=states, xbc=xbc, dt=dt, A=A, D=D, dt_bias=dt_bias):
                x = xbc[i, :, : h * p].unflatten(-1, (h, p))
                B, C = xbc[i, :, h * p : h * p + n][:, None], xbc[i, :, h * p + n :][:, None]
                return fn(states[i], x, dt[i], A, B, C, D, dt_bias=dt_bias, dt_softplus=True)

            try:
                ms = per_call_ms([lambda i=i: call(i) for i in range(layers)], repeat)
                check = base.clone()
                x = xbc[0, :, : h * p].unflatten(-1, (h, p))
                B, C = xbc[0, :, h * p : h * p + n][:, None], xbc[0, :, h * p + n :][:, None]
                ref_state = base.double()
                x64 = (t.double() for t in (x, dt[0], A, B, C, D, dt_bias))
                ref = ops.ssd_step(ref_state, *x64, dt_softplus=True)
                y = fn(check, x, dt[0], A, B, C, D, dt_bias=dt_bias, dt_softplus=True)
                rows.append([b, name, f"{ms * 1e3:.2f}", f"{rel(y, ref):.2e}", f"{rel(check, ref_state):.2e}"])
            except Exception:
                traceback.print_exc()
                rows.append([b, name, "failed", "", ""])
            del states
    return rows


def bench_norm(batches, repeat) -> list[list]:
    rows = []
    for b in batches:
        zx = torch.randn(LAYERS, b, 1, 2 * D_INNER + 8, device="cuda").to(torch.bfloat16)
        w = torch.randn(D_INNER, device="cuda").to(torch.bfloat16)
        for name, fn in norm_impls().items():

            def call(i, fn=fn, zx=zx, w=w):
                return fn(zx[i, ..., D_INNER : 2 * D_INNER], zx[i, ..., :D_INNER], w, 1e-5, D_INNER)

            try:
                ms = per_call_ms([lambda i=i: call(i) for i in range(LAYERS)], repeat)
                x, z = zx[0, ..., D_INNER : 2 * D_INNER], zx[0, ..., :D_INNER]
                ref = ops.gated_rms_norm(x.double(), z.double(), w.double(), 1e-5, D_INNER)
                rows.append([b, name, f"{ms * 1e3:.2f}", f"{rel(call(0), ref):.2e}"])
            except Exception:
                traceback.print_exc()
                rows.append([b, name, "failed", ""])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,16,512")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    batches = [int(v) for v in args.batches.split(",")]
    print(environment())
    rows = bench_state_update(batches, args.repeat)
    header = ["batch", "impl", "us", "y rel L2", "state rel L2"]
    print(report("ssd_step (state update, dt bias + softplus, D), per layer", header, rows))
    rows = bench_norm(batches, args.repeat)
    print(report("gated_rms_norm (d_inner 4096, one group), per layer", ["rows", "impl", "us", "rel L2"], rows))


if __name__ == "__main__":
    main()
