"""Does each vocoder conv give the same output samples whatever the length of its input? That is the condition
for a 16-bit stream equal to the one-shot decode bit for bit: every streamed sample is the same conv sum over
the same inputs as in the one-shot decode (zonos/codec/streaming.py), but the backend (cuDNN, oneDNN) picks
its algorithm, and so its summation order, by shape.  This measures torch's convs (cuDNN on the H200: most
16-bit convs there are length-dependent, docs/BENCHMARKS.md, conv exactness), the reason the decoder's convs became
ops with kernels of our own (zonos_accel/triton/vocoder.py, tested for this property in
tests/test_vocoder_ops.py).

For the codebook projection and every distinct conv of the DAC 44.1 kHz decoder (real sizes, random weights
and inputs), the one-shot call (the whole sequence with built-in zero padding, as ``nn.Conv1d`` /
``nn.ConvTranspose1d`` run it) is compared with the calls a stream makes for pushes of 1, 2, 4, 8, 16 and
32 frames (one push inside the sequence per size): the conv over
``[history | new]`` at the layer's sample rate without padding, the transposed conv over
``[last input | new inputs]``. Each cell counts the output samples that differ (0: bit for bit equal).
fp32 runs without TF32.

    python benchmarks/conv_exactness.py [--device cuda] [--frames 64] [--dtypes float16,bfloat16,float32]
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

from benchmarks.common import table
from zonos.codec.dac import DACConfig

CHUNKS = (1, 2, 4, 8, 16, 32)


def decoder_convs(config: DACConfig) -> list[dict]:
    """The decoder's distinct convs in forward order (after the quantizer's per-codebook projection): name,
    channels, kernel, dilation or stride, and the samples per code frame at their input."""
    c, rate = config.decoder_hidden_size, 1
    convs = [
        dict(name="codebook out_proj", cin=config.codebook_dim, cout=config.hidden_size, k=1, d=1, rate=rate),
        dict(name="conv in", cin=config.hidden_size, cout=c, k=7, d=1, rate=rate),
    ]
    for i, s in enumerate(config.upsampling_ratios):
        convs.append(dict(name=f"block {i} transposed", cin=c, cout=c // 2, k=2 * s, s=s, rate=rate))
        c, rate = c // 2, rate * s
        convs += [dict(name=f"block {i} dilation {d}", cin=c, cout=c, k=7, d=d, rate=rate) for d in (1, 3, 9)]
        convs.append(dict(name=f"block {i} kernel 1", cin=c, cout=c, k=1, d=1, rate=rate))
    convs.append(dict(name="conv out", cin=c, cout=1, k=7, d=1, rate=rate))
    return convs


def mismatches(conv: dict, frames: int, dtype: torch.dtype, device: str, gen: torch.Generator) -> list[int]:
    """Differing output samples of the stream's calls against the one-shot call, per chunk size."""
    cin, cout, k, rate = conv["cin"], conv["cout"], conv["k"], conv["rate"]
    n = frames * rate
    x = torch.randn(1, cin, n, generator=gen).to(device, dtype)
    b = torch.randn(cout, generator=gen).to(device, dtype)
    counts = []
    if "s" in conv:  # transposed: uncropped sample u is the one-shot output u - p
        s = conv["s"]
        p = math.ceil(s / 2)
        w = (torch.randn(cin, cout, k, generator=gen) * (cin * 2) ** -0.5).to(device, dtype)
        full = F.conv_transpose1d(x, w, b, stride=s, padding=p)
        for c in CHUNKS:
            new = c * rate
            i0 = n // 2 - new // 2  # an interior push
            part = F.conv_transpose1d(x[..., i0 - 1 : i0 + new], w, b, stride=s)[..., s : (new + 1) * s]
            counts.append(int((part != full[..., i0 * s - p : (i0 + new) * s - p]).sum()))
    else:
        d = conv["d"]
        p = (k - 1) * d // 2
        w = (torch.randn(cout, cin, k, generator=gen) * (cin * k) ** -0.5).to(device, dtype)
        full = F.conv1d(x, w, b, padding=p, dilation=d)
        padded = F.pad(x, (p, p))
        for c in CHUNKS:
            new = c * rate
            t0 = n // 2 - new // 2
            part = F.conv1d(padded[..., t0 : t0 + new + 2 * p], w, b, dilation=d)
            counts.append(int((part != full[..., t0 : t0 + new]).sum()))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--frames", type=int, default=64, help="frames of the one-shot input (≥ 2 × the largest chunk)")
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    args = ap.parse_args()
    if args.frames < 2 * max(CHUNKS):
        ap.error(f"--frames must be at least {2 * max(CHUNKS)}, so every push lies inside the sequence")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    start = time.perf_counter()
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"{where} | torch {torch.__version__} | cuDNN {torch.backends.cudnn.version()} | {args.frames} frames")
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        gen = torch.Generator().manual_seed(0)
        rows = []
        for conv in decoder_convs(DACConfig()):
            shape = f"{conv['cin']}→{conv['cout']} k{conv['k']}" + (f" s{conv['s']}" if "s" in conv else "")
            counts = mismatches(conv, args.frames, dtype, args.device, gen)
            row = {"conv": conv["name"], "shape": shape, "samples/frame": conv["rate"]}
            row.update({f"push {c}": n for c, n in zip(CHUNKS, counts)})
            rows.append(row)
        title = f"Output samples that differ from the one-shot call, {name} (0: bit for bit equal)"
        print(table(rows, title))
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
