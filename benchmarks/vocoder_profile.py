"""Where a streaming vocoder push spends its GPU time: torch.profiler over steady pushes of the real-size DAC
44.1 kHz decoder (random weights, fp16 autocast, CUDA-graph replays as in generate), kernels grouped by what
they do, in µs per push; and the one-shot decode of the same frames for comparison.

    python3 benchmarks/vocoder_profile.py [--chunks 1,2,8,32] [--pushes 20] [--ops triton,torch]
                                          [--sweep tiles|groups|stages|slices|split] [--layers]

``--ops torch`` runs the decoder's convs on cuDNN (Snake stays the Triton kernel).  ``--sweep tiles`` times the
stream and the one-shot decode for each tile configuration of our conv kernels (the same for every layer and
call, instead of ``_blocks``'s choice per call; any fixed one keeps the stream bit-exact, which the table
checks); ``--sweep groups`` does the same for the reduction group size (``GROUP_REDUCE``, the share of a
split-K program), and without the split; ``--sweep slices`` for the reduction elements per loop step
(``REDUCE`` in calls with many output tiles, ``SHORT_REDUCE`` with few), which must leave every sample as it
is; ``--sweep stages`` for the loads a short (dense-operand) call keeps in flight (``DENSE_STAGES``), and with
every call gathering its operands (``DENSE_BYTES`` = 0); ``--sweep split`` for the output tiles per SM below which
a call splits its reduction groups (``SPLIT_TILES_PER_SM``).
``--layers`` lists the GPU time of each conv layer (our kernels), per push and one-shot; with ``--sweep``, under
each configuration, then the totals side by side.  ``--ncu-push N`` makes
one steady push of N frames between ``cudaProfilerStart`` and ``cudaProfilerStop``, for Nsight Compute:

    ncu --clock-control none --profile-from-start off -k regex:_conv --section SpeedOfLight \\
        --section WarpStateStats --csv --page details python3 benchmarks/vocoder_profile.py --ncu-push 2
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections import defaultdict

import torch
from common import table
from streaming import torch_layer_ops, vocoder_cost
from torch.profiler import ProfilerActivity, profile
from triton import next_power_of_2

from zonos.codec.autoencoder import DACAutoencoder
from zonos.codec.dac import DACConfig
from zonos.codec.streaming import StreamingDACDecoder
from zonos.ops.backend import use_backend
from zonos_accel.triton import triton_backend
from zonos_accel.triton import vocoder as kernels

GROUPS = [  # first match wins
    ("conv (ours)", r"_conv_kernel|_conv_taps_kernel"),
    ("transposed conv (ours)", r"_conv_transpose_kernel"),
    ("history update (ours)", r"_tail_kernel"),
    ("Snake (ours)", r"_snake_kernel"),
    ("cuDNN conv", r"cudnn|conv|Conv|implicit|sm90_xmma|xmma|cutlass|nchw|nhwc|NHWC|NCHW"),
    ("copies / cat / index", r"copy|Copy|cat|Cat|index|Index|gather|embedding|fill"),
    ("elementwise", r"elementwise|vectorized|unrolled|Elementwise|tanh"),
]


def group_of(name: str) -> str:
    return next((label for label, pattern in GROUPS if re.search(pattern, name)), "other")


def gpu_events(fn) -> list:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def summarize(events: list, per: int) -> dict[str, tuple[float, float]]:
    """group -> (kernels, µs) per push."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        g = group_of(e.name)
        acc[g][0] += 1
        acc[g][1] += e.device_time_total
    return {g: (n / per, us / per) for g, (n, us) in acc.items()}


def sweep(
    codec: DACAutoencoder, chunks: list[int], configs: list[dict], apply, title: str, layers: int | None = None
) -> None:
    """Stream and one-shot cost (256 frames, fp16) under each of ``configs`` (``apply(config)`` sets one up; ``None``
    restores the default), a table printed as each configuration finishes (compiles dominate a sweep's time); and
    how many one-shot samples of fixed codes differ from the first configuration's.  With ``layers`` (steady pushes
    per size), the GPU time of each conv layer instead (:func:`profile_layers`), then a summary of the totals."""
    codes = torch.randint(0, 1024, (1, 9, 64), device="cuda")
    first = None
    totals = []
    try:
        for config in configs:
            apply(config)
            audio = codec.decode(codes)
            first = audio if first is None else first
            same = {"one-shot samples differing from the first row's": int((audio != first).sum())}
            if layers:
                rows = profile_layers(codec, chunks, layers)
                print(table(rows, f"{title}: {config}"), flush=True)
                totals.append({**config, **{k: v for k, v in rows[-1].items() if k != "layer"}, **same})
            else:
                rows = [{**config, **row, **same} for row in vocoder_cost(codec, 256, chunks)]
                print(table(rows, title), flush=True)
    finally:
        apply(None)
    if totals:
        print(table(totals, f"{title}: all conv layers"), flush=True)


# (BLOCK_CO, reduction slice, BLOCK_T): output channels × samples per program, channels × padded taps per step.
SWEEP = [(co, red, t) for co in (16, 32, 64) for red in (64, 128) for t in (32, 64)]


def sweep_tiles(codec: DACAutoencoder, chunks: list[int], layers: int | None = None) -> None:
    """The same tile for every layer and call instead of ``_blocks``'s choice (a transposed conv's: ``BLOCK_CO`` rows
    of (channel, phase), its phases together as ``_transposed_blocks`` groups them); any keeps the stream
    bit-exact.  The tap-major convs (blocks 3-4's k7 convs and the last) keep ``_taps_blocks``' tiles."""
    default = kernels._blocks, kernels._transposed_blocks

    def apply(config):
        if config is None:
            kernels._blocks, kernels._transposed_blocks = default
            return
        co, red, t = config["BLOCK_CO"], config["reduction slice"], config["BLOCK_T"]

        def blocks(c_out, c_in, taps, *_):
            return co, max(1, red // next_power_of_2(taps)), t, 4

        def transposed(c_out, c_in, taps, n_q, batch, stride, device):
            phases = stride & -stride
            return max(1, co // phases), phases, max(1, red // next_power_of_2(taps)), t, 4

        kernels._blocks, kernels._transposed_blocks = blocks, transposed

    configs = [{"BLOCK_CO": co, "reduction slice": red, "BLOCK_T": t} for co, red, t in SWEEP]
    sweep(codec, chunks, configs, apply, "Tile configuration of the vocoder conv kernels (every layer alike)", layers)


GROUP_SWEEP = [256, 512, 1024, 2048, None]  # reduction elements per group; None: no split-K launches


def sweep_groups(codec: DACAutoencoder, chunks: list[int], layers: int | None = None) -> None:
    default_group, default_split = kernels.GROUP_REDUCE, kernels._split

    def apply(config):
        group = None if config is None else config["group elements"]
        kernels.GROUP_REDUCE = group if isinstance(group, int) else default_group
        no_split = config is not None and not isinstance(group, int)
        kernels._split = (lambda n_groups, tiles, device: False) if no_split else default_split

    configs = [{"group elements": g or f"{default_group}, no split"} for g in GROUP_SWEEP]
    sweep(codec, chunks, configs, apply, "Reduction group size of the vocoder conv kernels", layers)


SLICE_SWEEP = [(64, 64), (64, 128), (64, 256), (128, 128)]  # reduction elements per slice: (REDUCE, SHORT_REDUCE)


def sweep_slices(codec: DACAutoencoder, chunks: list[int], layers: int | None = None) -> None:
    """Slices of every size chain the same products in the same groups: the samples must not change."""
    default = kernels.REDUCE, kernels.SHORT_REDUCE

    def apply(config):
        pair = default if config is None else (config["slice (many tiles)"], config["slice (few tiles)"])
        kernels.REDUCE, kernels.SHORT_REDUCE = pair

    configs = [{"slice (many tiles)": long, "slice (few tiles)": short} for long, short in SLICE_SWEEP]
    sweep(
        codec,
        chunks,
        configs,
        apply,
        "Reduction slice sizes of the vocoder conv kernels (REDUCE, SHORT_REDUCE)",
        layers,
    )


STAGE_SWEEP = [0, 2, 3, 4, 6, 8, None]  # DENSE_STAGES; None: no dense calls (every call gathers)


def sweep_stages(codec: DACAutoencoder, chunks: list[int], layers: int | None = None) -> None:
    default_stages, default_bytes = kernels.DENSE_STAGES, kernels.DENSE_BYTES

    def apply(config):
        stages = None if config is None else config["dense stages"]
        kernels.DENSE_STAGES = stages if isinstance(stages, int) else default_stages
        kernels.DENSE_BYTES = 0 if config is not None and not isinstance(stages, int) else default_bytes

    configs = [{"dense stages": "gather" if s is None else s} for s in STAGE_SWEEP]
    sweep(codec, chunks, configs, apply, "Slices in flight in the dense-operand vocoder convs", layers)


def sweep_constant(attr: str, label: str, values: list, title: str):
    """A ``--sweep`` over the values of one module constant of :mod:`zonos_accel.triton.vocoder`."""

    def run(codec: DACAutoencoder, chunks: list[int], layers: int | None = None) -> None:
        default = getattr(kernels, attr)

        def apply(config):
            setattr(kernels, attr, default if config is None else config[label])

        sweep(codec, chunks, [{label: v} for v in values], apply, title, layers)

    return run


# A call splits its reduction below this many output tiles per SM.
sweep_split = sweep_constant(
    "SPLIT_TILES_PER_SM", "split below tiles per SM", [1, 2, 4, 8], "When short calls split their reduction groups"
)
# The widest k7 convs that run tap-major (changes the samples of the layers it moves, streamed and one-shot alike).
sweep_tap_major = sweep_constant(
    "TAP_MAJOR_CHANNELS", "tap-major up to channels", [192, 384, 768], "Which k7 convs run tap-major"
)


def conv_layer_names(codec: DACAutoencoder) -> list[str]:
    """The decoder's convs in launch order: the codebooks' projection, then the decoder's layers."""
    names = ["codebooks -> latent", "conv1"]
    for b, _ in enumerate(codec.dac.decoder.block, 1):
        names.append(f"block {b} upsample")
        names += [f"block {b} res {r} conv{c}" for r in (1, 2, 3) for c in (1, 2)]
    return names + ["conv2 (tanh)"]


def conv_times(events: list, layers: int) -> list[float]:
    """Mean µs of each conv layer over the pushes (or decodes) in ``events``."""
    convs = sorted((e for e in events if re.search(r"_conv_kernel|_conv_taps_kernel|_conv_transpose_kernel", e.name)),
                   key=lambda e: e.time_range.start)  # fmt: skip
    if not convs or len(convs) % layers:
        raise RuntimeError(f"{len(convs)} conv kernels are not a whole number of {layers}-layer calls")
    calls = len(convs) // layers
    return [sum(e.device_time_total for e in convs[i::layers]) / calls for i in range(layers)]


def steady_pushes(codec: DACAutoencoder, chunk: int, count: int):
    """(a function making ``count`` steady pushes of ``chunk`` frames, the codes): a decoder pushed past its first
    audio (10 frames) and through the steady push twice (its warm-up and capture), so the function replays."""
    warm = (-(-16 // chunk) + 2) * chunk
    codes = torch.randint(0, 1024, (1, 9, warm + count * chunk), device="cuda")
    dec = StreamingDACDecoder(codec)
    for s in range(0, warm, chunk):
        dec.push(codes[..., s : s + chunk])

    def steady() -> None:
        for s in range(warm, warm + count * chunk, chunk):
            dec.push(codes[..., s : s + chunk])

    return steady, codes


def profile_layers(codec: DACAutoencoder, chunks: list[int], count: int) -> list[dict]:
    """Rows of µs per conv layer: a steady push of each size, and the one-shot decode per frame."""
    names = conv_layer_names(codec)
    columns = {}
    for chunk in chunks:
        steady, _ = steady_pushes(codec, chunk, count)
        columns[f"push of {chunk} µs"] = conv_times(gpu_events(steady), len(names))
    frames = 256
    codes = torch.randint(0, 1024, (1, 9, frames), device="cuda")
    codec.decode(codes)
    columns[f"one-shot µs per frame ({frames} frames)"] = [
        us / frames for us in conv_times(gpu_events(lambda: codec.decode(codes)), len(names))
    ]
    rows = [{"layer": name, **{k: v[i] for k, v in columns.items()}} for i, name in enumerate(names)]
    rows.append({"layer": "all convs", **{k: sum(v) for k, v in columns.items()}})
    return rows


def profile_pushes(codec: DACAutoencoder, chunks: list[int], count: int) -> list[dict]:
    """Rows of GPU time per kernel group: steady pushes of each size against the one-shot decode."""
    rows = []
    for chunk in chunks:
        steady, codes = steady_pushes(codec, chunk, count)
        one_shot = codes[..., : count * chunk]
        codec.decode(one_shot)
        groups = summarize(gpu_events(steady), count)
        frames = count * chunk
        shot = summarize(gpu_events(lambda one_shot=one_shot: codec.decode(one_shot)), 1)
        for label in sorted(set(groups) | set(shot), key=lambda g: -groups.get(g, (0, 0))[1]):
            n, us = groups.get(label, (0, 0.0))
            rows.append(
                {
                    "push frames": chunk,
                    "group": label,
                    "kernels per push": n,
                    "µs per push": us,
                    "µs per frame": us / chunk,
                    "one-shot µs per frame": shot.get(label, (0, 0.0))[1] / frames,
                }
            )
        total = sum(us for _, us in groups.values())
        shot_total = sum(us for _, us in shot.values())
        rows.append(
            {
                "push frames": chunk,
                "group": "total",
                "kernels per push": sum(n for n, _ in groups.values()),
                "µs per push": total,
                "µs per frame": total / chunk,
                "one-shot µs per frame": shot_total / frames,
            }
        )
    return rows


def chunk_sizes(text: str) -> list[int]:
    """``--chunks``: comma-separated positive ints."""
    try:
        sizes = [int(c) for c in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive frame counts, got {text!r}")
    return sizes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=chunk_sizes, default="1,2,8,32", help="push sizes in frames, comma-separated")
    p.add_argument("--pushes", type=int, default=20, help="steady pushes profiled per size")
    p.add_argument("--ops", default="triton", choices=["triton", "torch"], help="the decoder convs' implementation")
    p.add_argument(
        "--sweep",
        choices=["tiles", "groups", "stages", "slices", "split", "tap-major"],
        help="time every configuration of SWEEP (tiles), GROUP_SWEEP, STAGE_SWEEP, SLICE_SWEEP, or the values "
        "of SPLIT_TILES_PER_SM or TAP_MAJOR_CHANNELS "
        "instead (with --layers: each conv layer's time under each)",
    )
    p.add_argument("--layers", action="store_true", help="GPU time of each conv layer instead of kernel groups")
    p.add_argument(
        "--ncu-push",
        type=int,
        metavar="FRAMES",
        help="only make one steady push of FRAMES frames inside cudaProfilerStart/Stop (run under ncu "
        "--profile-from-start off)",
    )
    args = p.parse_args()
    if args.ncu_push is not None and args.ncu_push < 1:
        p.error(f"--ncu-push takes a positive frame count, got {args.ncu_push}")

    torch.manual_seed(0)
    codec = DACAutoencoder(DACConfig(), device="cuda")
    use_backend(codec.dac, triton_backend())
    if args.ncu_push:
        steady, _ = steady_pushes(codec, args.ncu_push, 1)
        steady()  # the graphs are captured and warm: the profiled push is a replay like any steady one
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        steady()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return
    if args.sweep:
        if args.ops == "torch":
            p.error("--sweep tunes our conv kernels; it cannot be combined with --ops torch")
        sweeps = {
            "tiles": sweep_tiles,
            "groups": sweep_groups,
            "stages": sweep_stages,
            "slices": sweep_slices,
            "split": sweep_split,
            "tap-major": sweep_tap_major,
        }
        sweeps[args.sweep](codec, args.chunks, args.pushes if args.layers else None)
        return
    if args.layers:
        if args.ops == "torch":
            p.error("--layers times our conv kernels; it cannot be combined with --ops torch")
        print(table(profile_layers(codec, args.chunks, args.pushes), "Vocoder conv layers (ours, fp16, graph replays)"))
        print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}")
        return
    with contextlib.ExitStack() as stack:
        if args.ops == "torch":
            stack.enter_context(torch_layer_ops(codec))
        rows = profile_pushes(codec, args.chunks, args.pushes)
    print(table(rows, f"Streaming vocoder push, GPU time by kernel group ({args.ops} convs, fp16, graph replays)"))
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
