"""What each part of the engine's work costs on the GPU as the number of streams grows.

Real-size Zonos-v0.1-hybrid and DAC 44.1 kHz with random bf16 weights. Tables:

- decode step: GPU ms of the engine's captured step over the first ``n`` slots (2n backbone rows, KV length
  ``--kv``), its kernels, and its byte floor (weights once, each row's SSM/conv state read and written, its KV
  rows read) at the read bandwidth measured in this run;
- vocoder: GPU ms of a steady streaming-decoder push of ``f`` frames for ``b`` streams at once (one captured
  graph), and per stream-frame;
- vocoder slab: GPU ms of a :class:`~zonos.codec.slab.VocoderSlab` push of ``b`` rows (inputs masked per row);
- join: ``u`` requests of ``--prefix`` tokens queued together (one batched prefill, for each bucket of the
  engine's staging rows): wall ms of the whole join (prefill pieces, first tokens, slot loads, one step) and the
  GPU ms of the prefill pieces alone, per request;
- real-time budget (with step and slab): per step bucket n, the step's GPU ms plus a frame's share of the slab's
  push of n rows, against one frame of audio (11.61 ms), and the joins per second the rest of the GPU's time
  pays for (at the cheapest per-request join timed);
- streams that fit (with step, slab and joins): what each stream costs per frame of audio (its slot's share of the
  step, its slab row, its join spread over ``--request-frames``) against what is left of a frame after the step's
  part that no stream pays for.

    python3 benchmarks/engine_parts.py [--buckets 1 8 64 128 256] [--rows 1 16 64 256] [--frames 1 16]
                                     [--parts join step vocoder slab]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from common import no_eos, table
from gpu import event_times, read_bandwidth_gbs, real_size_model

from zonos.codec.autoencoder import DACAutoencoder
from zonos.codec.dac import DACConfig
from zonos.codec.streaming import StreamingDACDecoder
from zonos.ops.sampler import features
from zonos.sampling import SamplingParams


def step_bytes(model, rows: int, kv_len: int) -> int:
    weights = sum(p.numel() * p.element_size() for p in model.backbone.parameters())
    weights += model.heads_weight.numel() * model.heads_weight.element_size()
    state = model.backbone.allocate_inference_state(1, kv_len, device="meta")
    per_row = 0
    for c in state.caches:
        if hasattr(c, "ssm"):
            per_row += 2 * (c.ssm.numel() * c.ssm.element_size() + c.conv.numel() * c.conv.element_size())
        else:
            per_row += c.k.numel() * c.k.element_size() * 2
    return weights + rows * per_row


def kernels(fn, n: int = 3) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return round(sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / n)


def step_table(model, buckets: list[int], kv: int, bandwidth: float) -> list[dict]:
    slots = max(buckets)
    model.start_engine(slots=slots, max_seqlen=kv + 64, queue_size=4)
    engine = model.engine
    for c in engine.slots.state.caches:
        for t in (getattr(c, a, None) for a in ("k", "v", "conv", "ssm")):
            if t is not None:
                t.normal_(0, 0.1)
    engine.slots.state.position.fill_(kv)
    use = features([SamplingParams(min_p=0.1)])
    processors = (no_eos(model),)
    rows = []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with engine.idle(), torch.cuda.stream(side):
        for n in buckets:

            def step(n=n):
                engine.graphs.step(engine.slots, n, use, processors, model.backbone.ops)
                engine.slots.state.position.fill_(kv)

            step()
            step()
            torch.cuda.synchronize()
            ms = statistics.median(event_times(step, repeat=30, warmup=3))
            floor = step_bytes(model, 2 * n, kv) / bandwidth * 1e3
            rows.append({"slots": n, "GPU ms": round(ms, 3), "floor ms": round(floor, 3),
                         "÷ floor": round(ms / floor, 2), "kernels": kernels(step),
                         "ms per slot": round(ms / n, 4)})  # fmt: skip
            print(rows[-1], flush=True)
    torch.cuda.synchronize()
    model.engine.shutdown()
    return rows


def vocoder_table(codec, batches: list[int], frames: list[int]) -> list[dict]:
    rows = []
    side = torch.cuda.Stream()
    g = torch.Generator("cuda").manual_seed(0)
    for f in frames:
        for b in batches:
            dec = StreamingDACDecoder(codec, cuda_graphs=True)
            codes = [torch.randint(0, 1024, (b, 9, f), device="cuda", generator=g) for _ in range(4)]
            with torch.cuda.stream(side):
                for i in range(40 // f + 4):  # past the lookahead: the state's shapes are steady
                    dec.push(codes[i % 4])
                i = [0]

                def push(dec=dec, codes=codes, i=i):
                    i[0] += 1
                    dec.push(codes[i[0] % 4])

                ms = statistics.median(event_times(push, repeat=20, warmup=3))
                n = kernels(push)
            torch.cuda.synchronize()
            rows.append({"frames": f, "streams": b, "GPU ms": round(ms, 3), "kernels": n,
                         "µs per stream-frame": round(1e3 * ms / (b * f), 2)})  # fmt: skip
            print(rows[-1], flush=True)
            del dec
            torch.cuda.empty_cache()
    return rows


def kernel_shares(fn, n: int = 3, top: int = 12) -> list[dict]:
    """GPU µs per call of ``fn`` by kernel name (the ``top`` costliest), from torch.profiler over ``n`` calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    total: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total.setdefault(e.name[:60], []).append(e.device_time)
    rows = sorted(total.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [{"kernel": k, "µs per call": round(sum(v) / n, 1), "launches per call": round(len(v) / n)} for k, v in rows]


def layer_times(codec, push, row_frames: int, n: int = 5) -> list[dict]:
    """GPU µs per push of each conv layer of the decoder (our kernels), over ``n`` pushes, and per row-frame."""
    from vocoder_profile import conv_layer_names, conv_times, gpu_events

    names = conv_layer_names(codec)

    def pushes():
        for _ in range(n):
            push()

    times = conv_times(gpu_events(pushes), len(names))
    out = [{"layer": k, "µs per push": round(us, 1), "ns per row-frame": round(1e3 * us / row_frames, 1)}
           for k, us in zip(names, times)]  # fmt: skip
    total = sum(times)
    out.append(
        {"layer": "all convs", "µs per push": round(total, 1), "ns per row-frame": round(1e3 * total / row_frames, 1)}
    )
    return out


def slab_table(
    codec, rows: list[int], frames: list[int], ops: str = "triton", shares: bool = False, layers: bool = False
) -> list[dict]:
    """GPU ms of a VocoderSlab push of ``b`` rows (every layer's input masked to each row's stream), beside the plain
    steady push of ``b`` streams in :func:`vocoder_table`; ``ops="torch"`` runs the layers on the torch references
    (cuDNN convs). ``shares`` prints each push's costliest kernels, ``layers`` each conv layer's GPU µs."""
    from streaming import torch_layer_ops

    from zonos.codec.slab import VocoderSlab

    out = []
    side = torch.cuda.Stream()
    g = torch.Generator("cuda").manual_seed(1)
    for f in frames:
        for b in rows:
            references = torch_layer_ops(codec) if ops == "torch" else contextlib.nullcontext()
            with references, torch.cuda.stream(side):
                slab = VocoderSlab(codec, rows=b, frames=f)
                for r in range(b):
                    slab.admit(r, -(r % f) - 8 * f)  # rows at every phase, ramping up then steady
                codes = [torch.randint(0, 1024, (b, 9, f), device="cuda", generator=g) for _ in range(4)]
                i = [0]

                def push(slab=slab, codes=codes, i=i):
                    i[0] += 1
                    slab.push(codes[i[0] % 4])

                for _ in range(3):
                    push()
                ms = statistics.median(event_times(push, repeat=20, warmup=3))
                n = kernels(push)
                if shares:
                    print(table(kernel_shares(push), f"slab push of {b} rows x {f} frames ({ops}): costliest kernels"))
                if layers and ops == "triton":
                    print(table(layer_times(codec, push, b * f), f"slab push of {b} rows x {f} frames: conv layers"))
            torch.cuda.synchronize()
            out.append({"ops": ops, "frames": f, "rows": b, "GPU ms": round(ms, 3), "kernels": n,
                        "µs per row-frame": round(1e3 * ms / (b * f), 2)})  # fmt: skip
            print(out[-1], flush=True)
            del slab
            torch.cuda.empty_cache()
    return out


def join_table(model, prefix_tokens: int) -> list[dict]:
    """Joins of ``u`` requests queued together (one batched prefill of u sequences): wall ms to every request's
    first frame, and GPU ms and kernels of the prefill pieces on the engine's staging rows of that bucket."""
    model.start_engine(slots=8, max_seqlen=prefix_tokens + 200, queue_size=8)
    engine = model.engine
    d = model.config.backbone.d_model
    prefix = torch.randn(2, prefix_tokens, d, device="cuda").to(model.dtype)
    side = torch.cuda.Stream()
    out = []
    for u, rows in engine.staging_rows.items():
        walls = []
        for _ in range(8):  # the engine's own join: to the first step (a 1-frame request is prefill + one step)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with engine.idle():  # queued together: admitted in one iteration, prefilled in one batch
                handles = [model.submit(prefix, max_new_tokens=1, logits_processor=no_eos(model)) for _ in range(u)]
            for h in handles:
                h.result()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3)
        hidden = torch.randn(rows.batch_size, prefix_tokens + 1, d, device="cuda").to(model.dtype)
        lengths = torch.full((rows.batch_size,), prefix_tokens + 1, device="cuda")
        with engine.idle(), torch.cuda.stream(side):

            def pieces(rows=rows, hidden=hidden, lengths=lengths):
                rows.reset()
                engine.graphs.prefill(model.backbone, hidden, rows, lengths)

            gpu = statistics.median(event_times(pieces, repeat=10, warmup=3))
            n = kernels(pieces)
        torch.cuda.synchronize()
        wall = statistics.median(walls[2:])
        out.append({"prefix tokens": prefix_tokens, "requests": u, "join wall ms": round(wall, 2),
                    "prefill GPU ms": round(gpu, 3), "GPU ms per request": round(gpu / u, 3),
                    "pieces kernels": n})  # fmt: skip
    model.engine.shutdown()
    return out


def _interpolate(points: list[tuple[int, float]], x: int) -> float:
    """Piecewise-linear through ``points`` (sorted by x), extended along the end segments past the ends."""
    if len(points) == 1:
        return points[0][1] * x / points[0][0]
    segments = list(zip(points, points[1:]))
    (x0, y0), (x1, y1) = next((seg for seg in segments if x <= seg[1][0]), segments[-1])
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def budget_table(steps: list[dict], slab: list[dict], joins: list[dict]) -> list[dict]:
    """The GPU's real-time budget at n streams: one decode step over n slots plus a frame's share of the slab's
    push of n rows must fit one frame of audio (512 / 44100 s); what is left over pays for joins (at the cheapest
    per-request prefill of the join table)."""
    frames = max(r["frames"] for r in slab)
    pushes = [(r["rows"], r["GPU ms"] / frames) for r in sorted(slab, key=lambda r: r["rows"]) if r["frames"] == frames]
    join_ms = min((r["GPU ms per request"] for r in joins), default=None)
    budget = 1e3 * 512 / 44100
    out = []
    for r in steps:
        n = r["slots"]
        vocoder = _interpolate(pushes, n)
        left = budget - r["GPU ms"] - vocoder
        out.append(
            {
                "streams": n,
                "step GPU ms": r["GPU ms"],
                f"slab ms per frame ({frames}-frame pushes)": round(vocoder, 3),
                "÷ audio frame": round((r["GPU ms"] + vocoder) / budget, 2),
                "joins/s left": round(1e3 * left / budget / join_ms, 1) if join_ms and left > 0 else 0.0,
            }
        )
    return out


def capacity_table(steps: list[dict], slab: list[dict], joins: list[dict], request_frames: int) -> list[dict]:
    """Streams that fit one frame of audio per frame, from what each stream costs: the step's growth per slot and
    its part that no stream pays for (a least-squares line through the buckets of 8 slots or more), its slab row
    (per row-frame at the slab's most rows and frames), and its join spread over a request's frames, at the
    cheapest and the costliest per-request join timed."""
    points = [(r["slots"], r["GPU ms"]) for r in steps if r["slots"] >= 8]
    if len(points) < 2 or not joins:
        return []
    frames = max(r["frames"] for r in slab)
    widest = max((r for r in slab if r["frames"] == frames), key=lambda r: r["rows"])
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    per_slot = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    fixed = my - per_slot * mx
    row = widest["GPU ms"] / (widest["rows"] * frames)
    budget = 1e3 * 512 / 44100
    out = []
    for label, join in (("cheapest", min(joins, key=lambda r: r["GPU ms per request"])),
                        ("costliest", max(joins, key=lambda r: r["GPU ms per request"]))):  # fmt: skip
        per = per_slot + row + join["GPU ms per request"] / request_frames
        out.append({"join": f"{label} ({join['requests']} at once)", "fixed step ms": round(fixed, 3),
                    "step ms per slot": round(per_slot, 4), "slab ms per row-frame": round(row, 4),
                    "join ms per request": join["GPU ms per request"], "ms per stream-frame": round(per, 4),
                    "streams that fit": int((budget - fixed) / per)})  # fmt: skip
    return out


def vocoder_config(text: str) -> dict:
    """``--vocoder-configs``: ``NAME=V[,NAME=V]`` of constants of zonos_accel.triton.vocoder, each an int or a tuple of
    ints written ``A:B:C`` (e.g. ``CHANNELS_LAST_TILE=64:1024:4``), or ``default``."""
    if text == "default":
        return {}
    config = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        parts = value.split(":")
        if not name.isupper() or not all(p.lstrip("-").isdigit() for p in parts):
            raise argparse.ArgumentTypeError(f"expected NAME=INT[:INT...][,NAME=...] or 'default', got {text!r}")
        config[name] = int(value) if len(parts) == 1 else tuple(int(p) for p in parts)
    return config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--buckets", type=int, nargs="+", default=[1, 8, 64, 128, 256], help="slot buckets to time")
    ap.add_argument("--kv", type=int, default=270, help="KV length of every row (prefix + half the frames)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256], help="streams per vocoder push")
    ap.add_argument("--frames", type=int, nargs="+", default=[1, 16], help="frames per vocoder push")
    ap.add_argument("--prefix", type=int, default=120, help="prefix tokens of the join")
    ap.add_argument("--parts", nargs="+", default=["join", "step", "vocoder", "slab"], help="tables to make")
    ap.add_argument("--slab-ops", nargs="+", default=["triton"], choices=["triton", "torch"],
                    help="the slab's layers: our kernels, or the torch references (cuDNN convs)")  # fmt: skip
    ap.add_argument("--kernel-shares", action="store_true", help="print each slab push's costliest kernels")
    ap.add_argument("--layer-times", action="store_true", help="print each slab push's GPU time per conv layer")
    ap.add_argument("--request-frames", type=int, default=300, help="frames per request, for the streams that fit")
    ap.add_argument("--vocoder-configs", type=vocoder_config, nargs="+", default=[{}], metavar="NAME=V[,NAME=V]",
                    help="slab: a run with each set of zonos_accel.triton.vocoder constants (e.g. FLAT_ROWS=1000000 "
                    "TAP_MAJOR_CHANNELS=192; 'default': as they are)")  # fmt: skip
    args = ap.parse_args()
    bandwidth = read_bandwidth_gbs() * 1e9
    model = real_size_model(max_seqlen=1024)
    codec = DACAutoencoder(DACConfig(), device="cuda")
    model.autoencoder = codec
    model.use_accelerators()
    print(f"read bandwidth {bandwidth / 1e9:.0f} GB/s; {torch.cuda.get_device_name()}")
    with torch.inference_mode():  # the engine's worker made the graphs' static tensors in inference mode
        joins = join_table(model, args.prefix) if "join" in args.parts else []
        steps = step_table(model, args.buckets, args.kv, bandwidth) if "step" in args.parts else []
        vocoder = vocoder_table(codec, args.rows, args.frames) if "vocoder" in args.parts else []
        slab = []
        if "slab" in args.parts:
            from zonos_accel.triton import vocoder as kernels

            for config in args.vocoder_configs:
                defaults = {name: getattr(kernels, name) for name in config}
                label = ",".join(f"{k}={v}" for k, v in config.items()).replace(" ", "") or "default"
                print(f"slab with {label}", flush=True)
                try:
                    for name, value in config.items():
                        setattr(kernels, name, value)
                    for ops in args.slab_ops:
                        rows = slab_table(codec, args.rows, args.frames, ops, args.kernel_shares, args.layer_times)
                        slab += [{"constants": label, **r} for r in rows]
                finally:
                    for name, value in defaults.items():
                        setattr(kernels, name, value)
    first = [r for r in slab if r["ops"] == args.slab_ops[0] and r["constants"] == slab[0]["constants"]]
    budget = budget_table(steps, first, joins) if steps and slab else []
    fit = capacity_table(steps, first, joins, args.request_frames) if steps and slab else []
    for rows, title in ((steps, "decode step over n slots (2n rows)"), (vocoder, "streaming vocoder push, b streams "
                        "together"), (slab, "vocoder slab push, b rows"), (joins, "join"),
                        (budget, "real-time budget: step + slab per frame against 11.61 ms of audio"),
                        (fit, f"streams that fit (joins over {args.request_frames} frames a request)")):  # fmt: skip
        if rows:
            print(table(rows, title))


if __name__ == "__main__":
    main()
