"""Decode step of Zonos-v0.1-hybrid (random bf16 weights) on one GPU: one request, with and without CFG.

The engine's slot always runs 2 backbone rows (cond and uncond), so guidance off (scale 1.0) moves the same
bytes. For each op backend (``benchmarks/gpu.py``'s OPS_KINDS) and guidance setting it reports:
GPU ms per step (median of replays of the engine's captured step, CUDA events), mean wall ms per step inside
``generate`` (eager and with graphs), kernels per step (torch.profiler over graph replays),
bytes per step (weights + SSM/conv state read and written + KV rows read), the floor (bytes ÷ the read
bandwidth measured in this run), the ratio to the floor, and the real-time factor (11.61 ms ÷ wall step).
It also checks, at real size, that the Triton backend's logits follow the torch backend's.

    python3 benchmarks/decode_step.py [--steps 200] [--eager-steps 30] [--prefix 120] [--max-seqlen 4096]
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback

import torch
from common import no_eos
from gpu import (
    FRAME_MS,
    OPS_KINDS,
    decode_step,
    environment,
    event_times,
    read_bandwidth_gbs,
    real_size_model,
    report,
    use_ops,
)

from zonos.backbone.attention import Attention
from zonos.codebook_pattern import N_CODEBOOKS
from zonos.model import Zonos
from zonos.ops.backend import REFERENCE

PARAMS = {"min_p": 0.1}


def step_bytes(model, batch: int, kv_rows: int) -> dict[str, int]:
    """Bytes one step must move: every backbone and head weight read once, each Mamba2 layer's SSM and conv
    state read and written, and ``kv_rows`` rows of each attention layer's keys and values read."""
    weights = sum(p.numel() * p.element_size() for p in model.backbone.parameters())
    weights += sum(h.weight.numel() * h.weight.element_size() for h in model.heads)
    state = model.backbone.allocate_inference_state(batch, 1)
    ssm = kv = 0
    for layer, cache in zip(model.backbone.layers, state.caches):
        if isinstance(layer.mixer, Attention):
            kv += 2 * batch * kv_rows * cache.k.shape[2] * cache.k.shape[3] * cache.k.element_size()
        else:
            ssm += 2 * (cache.ssm.numel() * cache.ssm.element_size() + cache.conv.numel() * cache.conv.element_size())
    return {"weights": weights, "state": ssm, "kv": kv}


def kernels_per_replay(step, n: int = 5) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name]
    return round(len(kernels) / n)


def generate_wall_ms(model, prefix, cfg_scale: float, steps: int) -> tuple[float, int, float]:
    """Mean wall ms per decode step inside ``generate`` (from step 1 to the synchronized end: the engine reads
    the device only every few steps, so gaps between callbacks show queueing, not steps), steps run, and
    seconds from the call to step 1."""
    stamps = []

    def callback(frame, step, max_steps):
        stamps.append(time.perf_counter())
        return True

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(
        prefix,
        max_new_tokens=steps,
        cfg_scale=cfg_scale,
        sampling_params=PARAMS,
        progress_bar=False,
        callback=callback,
        generator=torch.Generator("cuda").manual_seed(0),
        logits_processor=no_eos(model),
    )
    torch.cuda.synchronize()
    end = time.perf_counter()
    return (end - stamps[0]) * 1e3 / (len(stamps) - 1), len(stamps), stamps[0] - t0


def graph_gpu_ms(model, prefix, cfg_scale: float, replays: int) -> tuple[float, float, object, int]:
    """A short request (prefill ``prefix``, capture the step), then time replays of the engine's captured step.
    Returns (median ms, p10-p90 spread ms, the step, the slot's KV position)."""
    generate_wall_ms(model, prefix, cfg_scale, 16)
    step = decode_step(model, PARAMS, (no_eos(model),))
    with model.engine.idle():
        ms = event_times(step, repeat=replays, warmup=5)
        position = int(model.engine.slots.state.position[0])
    deciles = statistics.quantiles(ms, n=10)
    return statistics.median(ms), deciles[-1] - deciles[0], step, position


@torch.inference_mode()
def _guided(m, hidden: torch.Tensor) -> torch.Tensor:
    return m.guided_logits(hidden, torch.full((1,), 2.0, device=hidden.device))


@torch.inference_mode()
def logits_check(model, prefix, steps: int = 8) -> dict[str, list[float]]:
    """Relative error of each bf16 backend's logits against the same weights in float32 (torch ops):
    prefill, then greedy steps all fed with the float32 run's tokens (the backbone and heads, no engine)."""
    from zonos_accel.triton import triton_backend

    with torch.device("meta"):
        reference = Zonos(model.config, max_seqlen=model.max_seqlen)
    reference.load_checkpoint(model.state_dict(), device="cuda", dtype=torch.float32)
    reference.eval()
    runs = {}
    for name, m, backend in (
        ("fp32", reference, REFERENCE),
        ("torch", model, REFERENCE),
        ("triton", model, triton_backend()),
    ):
        m.set_backend(backend)
        state = m.backbone.allocate_inference_state(2, prefix.shape[1] + steps + 1)
        codes = torch.full((1, N_CODEBOOKS, 1), m.masked_token_id, device="cuda")
        hidden = torch.cat([prefix.to(m.dtype), m.embed_codes(codes).expand(2, -1, -1)], dim=1)
        out = [_guided(m, m.backbone(hidden, state)[:, -1])]
        for i in range(steps):
            tokens = (runs["fp32"][i] if "fp32" in runs else out[-1]).argmax(-1)
            h = m.embed_codes(tokens[..., None]).expand(2, -1, -1)
            out.append(_guided(m, m.backbone.step(h, state)[:, -1]))
        runs[name] = out
    errors = {}
    for name in ("torch", "triton"):
        errors[name] = []
        for r, t in zip(runs["fp32"], runs[name]):
            finite = torch.isfinite(r)  # the vocabulary padding and barred slots are -inf in both
            errors[name].append(((t[finite] - r[finite]).norm() / r[finite].norm()).item())
    return errors


def measure(model, prefix, ops: str, cfg_scale: float, bw: float, args, rows: list, detail: list) -> None:
    batch = 2  # an engine slot runs its cond and uncond rows whatever the guidance scale
    use_ops(model, ops, cuda_graphs=False)
    eager_wall, _, _ = generate_wall_ms(model, prefix, cfg_scale, args.eager_steps)
    use_ops(model, ops)
    graphs = model.engine.graphs
    t0 = time.perf_counter()
    gpu_ms, spread, step, position = graph_gpu_ms(model, prefix, cfg_scale, args.steps)
    first = time.perf_counter() - t0
    kernels = kernels_per_replay(step)
    captures = graphs.captures
    generate_wall_ms(model, prefix, cfg_scale, 20)  # a request that pays no capture
    wall, steps_run, to_first = generate_wall_ms(model, prefix, cfg_scale, args.steps)
    assert graphs.captures == captures, "a later request captured again"
    kv_rows = args.max_seqlen if ops == "torch" else position
    moved = step_bytes(model, batch, kv_rows)
    floor_bytes = step_bytes(model, batch, position)
    floor_ms = sum(floor_bytes.values()) / (bw * 1e9) * 1e3
    rows.append(
        [
            ops,
            "on" if cfg_scale != 1.0 else "off (scale 1.0)",
            f"{gpu_ms:.3f}",
            f"{eager_wall:.2f}",
            f"{wall:.3f}",
            f"{wall - gpu_ms:+.3f}",
            kernels,
            f"{sum(moved.values()) / 1e9:.3f}",
            f"{floor_ms:.3f}",
            f"{gpu_ms / floor_ms:.2f}",
            f"{FRAME_MS / wall:.2f}x",
        ]
    )
    detail.append(
        f"{ops} cfg={cfg_scale}: GPU p10–p90 spread {spread:.3f} ms over {args.steps} replays; "
        f"KV position of the replays {position}; first request + step capture {first:.2f} s (incl. warm-up/JIT); "
        f"generate call → step 1 {to_first * 1e3:.1f} ms; {steps_run} steps; "
        f"bytes: weights {moved['weights'] / 1e9:.3f} GB, SSM+conv state r/w {moved['state'] / 1e6:.1f} MB, "
        f"KV {moved['kv'] / 1e6:.1f} MB ({kv_rows} rows)"
    )


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eager-steps", type=int, default=30)
    ap.add_argument("--prefix", type=int, default=120)
    ap.add_argument("--max-seqlen", type=int, default=4096)
    ap.add_argument("--ops", default="torch,triton", help=f"comma-separated, from {', '.join(OPS_KINDS)}")
    args = ap.parse_args()

    print(environment())
    model = real_size_model(args.max_seqlen)
    bw = read_bandwidth_gbs()
    torch.cuda.empty_cache()
    print(f"read bandwidth: {bw:.0f} GB/s (sum over 4 GiB bf16)")
    gen = torch.Generator("cuda").manual_seed(1)
    prefix = torch.randn(2, args.prefix, 2048, device="cuda", generator=gen).to(torch.bfloat16)

    rows, detail = [], []
    for ops in args.ops.split(","):
        for cfg_scale in (2.0, 1.0):
            try:
                measure(model, prefix, ops, cfg_scale, bw, args, rows, detail)
            except Exception:  # keep the other configurations' numbers
                traceback.print_exc()
                rows.append([ops, cfg_scale, "failed (see log)"])

    check = {}
    try:
        check = logits_check(model, prefix)
    except Exception:
        traceback.print_exc()
    for line in detail:
        print(line)
    for name, errors in check.items():
        print(
            f"{name} ops, bf16: logits' relative error against float32 weights (prefill, then greedy steps): "
            + " ".join(f"{e:.1e}" for e in errors)
        )
    print()
    print(
        report(
            f"Decode step, Zonos-v0.1-hybrid random bf16, prefix {args.prefix}, max_seqlen {args.max_seqlen}",
            [
                "ops",
                "CFG",
                "GPU ms/step (graph)",
                "wall ms/step eager",
                "wall ms/step graph",
                "wall − GPU",
                "kernels/step",
                "GB/step",
                "floor ms",
                "× floor",
                "real time",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
