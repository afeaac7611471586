"""The decode step's Mamba2 ops at Zonos-v0.1-hybrid shapes: our Triton state update (``ssd_step``) and gated
RMSNorm against mamba_ssm's kernels (when importable) and the torch references; and a whole Mamba2 block's step
(``mamba_block_step``: add + LayerNorm, in_proj, conv, state update, gated norm, out_proj) fused in three kernels
against the op-by-op path with cuBLAS and with the CuTeDSL GEMV, and against its byte floor; in one run.

As in a decode step, one CUDA graph runs the op once per Mamba2 layer (34), each on its own state / inputs (and, for
the block, its own weights), so the states and weights are as cold as in the step (34 × the state is past the 60 MB
L2 from batch 2 on); the time is the median CUDA-event time of a replay divided by 34. Each row checks the result
against float64.

    source .device/activate.sh && python3 benchmarks/mamba_decode_ops.py [--batches 1,2,16,512] [--rows 1,2,8,16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import traceback

import torch
from gpu import environment, event_times, read_bandwidth_gbs, report

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


def block_impls() -> dict:
    """name -> a ``mamba_block_step``: op by op on the Triton ops with cuBLAS projections, the same with the CuTeDSL
    GEMV, and the three fused kernels."""
    from zonos.ops.backend import REFERENCE
    from zonos_accel.triton import DEFAULT_OPS, FUSED_BLOCK_OPS, triton_backend
    from zonos_accel.triton.mamba_block import mamba_block_step

    op_by_op = triton_backend(REFERENCE)
    impls = {"op by op, cuBLAS": op_by_op.mamba_block_step}
    try:
        from zonos_accel.gemv import cute_gemv_backend

        impls["op by op, CuTeDSL GEMV"] = cute_gemv_backend(op_by_op).mamba_block_step
    except (ImportError, RuntimeError) as e:
        print(f"CuTeDSL GEMV left out: {e}", file=sys.stderr)
    fused = triton_backend(REFERENCE, DEFAULT_OPS + FUSED_BLOCK_OPS).op("mamba_block_step")
    assert fused.fused.fast is mamba_block_step  # what use_accelerators(fused_blocks=True) serves
    impls["fused (3 kernels)"] = mamba_block_step

    def state_update_in_in_proj(counters=None, **args):
        from zonos_accel.triton import mamba_block

        saved, mamba_block.SSM_IN_PROJ = mamba_block.SSM_IN_PROJ, True  # read at the call (and so at capture)
        try:
            return mamba_block_step(**args, counters=counters)
        finally:
            mamba_block.SSM_IN_PROJ = saved

    impls["fused, state update in in_proj (2 kernels)"] = state_update_in_in_proj
    return impls


def block_args(b: int, seed: int) -> dict:
    """One Mamba2 block's step arguments at real size in bf16 (weights scaled so activations stay O(1))."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, device="cuda", generator=gen)).to(torch.bfloat16)

    d, h, p, n, k = 2048, HEADS, HEADDIM, STATE, 4
    conv_dim = D_INNER + 2 * n
    return dict(
        hidden=randn(b, d), residual=randn(b, d), norm_weight=1 + randn(d, scale=0.1), norm_bias=randn(d, scale=0.1),
        norm_eps=1e-5, in_weight=randn(D_INNER + conv_dim + h, d, scale=d**-0.5), conv_state=randn(b, conv_dim, k),
        conv_weight=randn(conv_dim, 1, k, scale=0.5), conv_bias=randn(conv_dim, scale=0.1),
        ssm_state=randn(b, h, p, n), A=-torch.rand(h, device="cuda", generator=gen) * 8, D=randn(h),
        dt_bias=randn(h) - 3, gate_weight=1 + randn(D_INNER, scale=0.1), gate_eps=1e-5,
        out_weight=randn(d, D_INNER, scale=D_INNER**-0.5),
    )  # fmt: skip


def bench_block(rows_list, repeat, bandwidth) -> list[list]:
    rows = []
    for b in rows_list:
        layers = [block_args(b, seed) for seed in range(LAYERS)]
        weights = sum(layers[0][key].numel() * 2 for key in ("in_weight", "out_weight"))
        state = 2 * sum(layers[0][key].numel() * 2 for key in ("conv_state", "ssm_state"))  # read and written
        floor_us = (weights + state) / bandwidth * 1e6
        for name, fn in block_impls().items():
            counting = "2 kernels" in name  # the decode cache's zeroed counters, one set per layer
            extra = [{"counters": torch.zeros(HEADS, dtype=torch.int32, device="cuda")} if counting else {}
                     for _ in layers]  # fmt: skip
            try:
                ms = per_call_ms([lambda a=a, e=e, fn=fn: fn(**a, **e) for a, e in zip(layers, extra)], repeat)
                args = block_args(b, 0)
                ref = ops.mamba_block_step(**{k: v.double() if torch.is_tensor(v) else v for k, v in args.items()})
                out, _ = fn(**args, **extra[0])
                rows.append([b, name, f"{ms * 1e3:.2f}", f"{ms * 1e3 / floor_us:.2f}", f"{rel(out, ref[0]):.2e}"])
            except Exception:
                traceback.print_exc()
                rows.append([b, name, "failed", "", ""])
        del layers
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,16,512")
    parser.add_argument("--rows", default="1,2,8,16", help="rows (batch × CFG) of the whole-block table")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--parts", default="state,norm,block", help="tables to print: state, norm, block")
    args = parser.parse_args()
    batches = [int(v) for v in args.batches.split(",")]
    parts = set(args.parts.split(","))
    print(environment())
    if "state" in parts:
        rows = bench_state_update(batches, args.repeat)
        header = ["batch", "impl", "us", "y rel L2", "state rel L2"]
        print(report("ssd_step (state update, dt bias + softplus, D), per layer", header, rows))
    if "norm" in parts:
        rows = bench_norm(batches, args.repeat)
        print(report("gated_rms_norm (d_inner 4096, one group), per layer", ["rows", "impl", "us", "rel L2"], rows))
    if "block" in parts:
        bandwidth = read_bandwidth_gbs() * 1e9
        rows = bench_block([int(v) for v in args.rows.split(",")], args.repeat, bandwidth)
        title = (f"mamba_block_step, per layer (floor: weights once, conv and SSM state read and written, at "
                 f"{bandwidth / 1e9:.0f} GB/s)")  # fmt: skip
        print(report(title, ["rows", "impl", "us", "x floor", "rel L2"], rows))


if __name__ == "__main__":
    main()
