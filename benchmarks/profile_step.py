"""Where a graph-replayed decode step of Zonos-v0.1-hybrid (random bf16, one request with CFG) spends its GPU
time: torch.profiler over replays of the engine's captured step, kernels grouped by what they do, in µs per step
and % of the step.

    python3 benchmarks/profile_step.py [--ops torch,triton] [--replays 20]
"""

from __future__ import annotations

import argparse
import re
import traceback
from collections import defaultdict

import torch
from common import no_eos
from gpu import decode_step, environment, real_size_model, report, use_ops
from torch.profiler import ProfilerActivity, profile

from zonos.ops.sampler import features
from zonos.sampling import SamplingParams

PARAMS = {"min_p": 0.1}

# First match wins; names are CUDA kernel names as the profiler reports them.
GROUPS = [
    ("decode attention (ours)", r"_decode_kernel"),
    ("residual add + LayerNorm (ours)", r"_add_layer_norm_kernel"),
    ("rotary + KV write (ours)", r"_rotate_and_cache_kernel"),
    ("MLP SiLU·mul (ours)", r"_silu_mul_kernel"),
    ("conv_step (ours)", r"_conv_step_kernel"),
    ("ssd_step (mamba_ssm)", r"_selective_scan_update"),
    ("gated RMSNorm (mamba_ssm)", r"_layer_norm_fwd_1pass"),
    ("linear (cuBLAS GEMV/GEMM)", r"gemv|gemm|cublas|sm90_xmma|xmma|cutlass|splitK|nvjet"),
    ("SDPA (torch)", r"fmha|flash|attention|efficient"),
    ("LayerNorm (torch)", r"layer_norm"),
    ("sampling (sort/topk/scatter/rng/argmax)", r"sort|topk|scatter|exponential|distribution|argmax|radix|Sort"),
    ("copies / cat / index", r"copy|Copy|cat|Cat|index|Index|gather|fill"),
    ("softmax / reductions", r"softmax|reduce|Reduce"),
    ("elementwise", r"elementwise|vectorized|unrolled|Elementwise"),
]


def group_of(name: str) -> str:
    for label, pattern in GROUPS:
        if re.search(pattern, name):
            return label
    return "other"


def profile_replays(step, replays: int):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            step()
        torch.cuda.synchronize()
    return [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and not re.search("Memcpy|Memset", e.name)
    ]


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--ops", default="torch,triton", help="comma-separated, from torch, triton, triton-nopdl, triton+gemv"
    )
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--prefix", type=int, default=120)
    args = ap.parse_args()
    print(environment())
    model = real_size_model()
    prefix = torch.randn(2, args.prefix, 2048, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    prefix = prefix.to(torch.bfloat16)
    for ops in args.ops.split(","):
        try:
            profile_ops(model, prefix, ops, args.replays)
        except Exception:  # keep the other backend's table
            traceback.print_exc()


def profile_ops(model, prefix, ops: str, replays: int) -> None:
    use_ops(model, ops)
    model.generate(
        prefix, max_new_tokens=16, sampling_params=PARAMS, progress_bar=False, logits_processor=no_eos(model)
    )
    step = decode_step(model, PARAMS, (no_eos(model),))
    with model.engine.idle():
        for _ in range(5):
            step()
        events = profile_replays(step, replays)
    if not events:
        print(f"{ops}: the profiler recorded no kernels inside graph replays")
        return
    us, count, names = defaultdict(float), defaultdict(int), defaultdict(float)
    for e in events:
        g = group_of(e.name)
        us[g] += e.time_range.elapsed_us() / replays
        count[g] += 1
        names[e.name] += e.time_range.elapsed_us() / replays
    total = sum(us.values())
    rows = [
        [g, f"{count[g] / replays:.0f}", f"{us[g]:.1f}", f"{100 * us[g] / total:.1f}"]
        for g in sorted(us, key=us.get, reverse=True)
    ]
    rows.append(["total (kernel time, no gaps)", f"{len(events) / replays:.0f}", f"{total:.1f}", "100"])
    print()
    print(report(f"Decode step by kernel group, ops={ops}", ["group", "kernels", "µs/step", "%"], rows))
    top = sorted(names, key=names.get, reverse=True)[:15]
    print(report(f"Top kernels, ops={ops}", ["kernel", "µs/step"], [[n[:90], f"{names[n]:.1f}"] for n in top]))
    launches = defaultdict(int)
    for e in events:
        launches[e.name] += 1
    most = sorted(launches, key=launches.get, reverse=True)[:40]
    rows = [[n[:90], f"{launches[n] / replays:.0f}", f"{names[n]:.1f}"] for n in most]
    print(report(f"Kernels by launches per step, ops={ops}", ["kernel", "launches", "µs/step"], rows))
    print(report(f"Torch ops of one eager step by launches, ops={ops}", ["op", "calls", "GPU µs"], eager_ops(model)))


def eager_ops(model, top: int = 20) -> list[list]:
    """Which torch ops launch the kernels: one eager decode step of the engine's first slot (one request, CFG)
    under the profiler."""
    engine = model.engine
    use = features([SamplingParams.from_dict(PARAMS)])
    processors = (no_eos(model),)
    with engine.idle():
        engine.slots.step(1, use, processors)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            engine.slots.step(1, use, processors)
            torch.cuda.synchronize()
    ops = [e for e in prof.key_averages() if e.key.startswith("aten::") and e.device_time_total > 0]
    ops.sort(key=lambda e: e.count, reverse=True)
    return [[e.key, e.count, f"{e.device_time_total:.0f}"] for e in ops[:top]]


if __name__ == "__main__":
    main()
