"""How long does reading a real-size checkpoint onto the GPU take: ours (``zonos.checkpoint.load_safetensors``,
the file read once in pinned pieces) against safetensors' ``load_file(..., device="cuda")``?

Writes a Zonos-v0.1-hybrid-sized file of random bf16 tensors (3.3 GB; the layout of ``model.safetensors``) unless
``--checkpoint`` names one, then loads it ``--reps`` times with each method, alternating, synchronized, and prints
the median seconds and GB/s. The file is in the page cache after the first read (what a server's restart sees).

    python3 benchmarks/checkpoint_load.py [--checkpoint PATH] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import CONFIGS, table
from safetensors.torch import load_file, save_file

from zonos.checkpoint import load_safetensors
from zonos.config import ZonosConfig
from zonos.model import Zonos


def write(path: Path) -> None:
    config = ZonosConfig.from_json(CONFIGS / "zonos-v0.1-hybrid_config.json")
    with torch.device("meta"):
        skeleton = Zonos(config).state_dict()
    gen = torch.Generator().manual_seed(0)
    state = {}
    for name, t in skeleton.items():
        if t.is_floating_point():
            state[name] = torch.randn(t.shape, generator=gen).bfloat16()
        else:
            state[name] = torch.zeros(t.shape, dtype=t.dtype)
    save_file(state, str(path))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, help="a .safetensors file (default: write a real-size random one)")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    path = args.checkpoint
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="zonos-load-")) / "model.safetensors"
        write(path)
    size = path.stat().st_size
    methods = {
        "zonos.checkpoint.load_safetensors": lambda: load_safetensors(path, "cuda"),
        "safetensors load_file(device='cuda')": lambda: load_file(str(path), device="cuda"),
    }
    torch.zeros(1, device="cuda")
    times = {name: [] for name in methods}
    for _ in range(args.reps):
        for name, load in methods.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            state = load()
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
            del state
    rows = []
    for name, ts in times.items():
        s = statistics.median(ts)
        rows.append({"method": name, "median s": f"{s:.3f}", "GB/s": f"{size / s / 1e9:.1f}"})
    print(table(rows, f"Checkpoint read onto the GPU: {size / 1e9:.2f} GB, {torch.cuda.get_device_name()}"))


if __name__ == "__main__":
    main()
