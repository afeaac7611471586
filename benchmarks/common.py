"""Shared set-up for benchmarks: real-size models with random weights (timing does not depend on values)."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from zonos.config import ZonosConfig
from zonos.model import Zonos

CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "data"


@torch.no_grad()
def random_model(kind: str = "hybrid", device: str = "cuda", dtype: torch.dtype = torch.bfloat16, **kwargs) -> Zonos:
    """The published architecture (``hybrid`` or ``transformer``) with small random weights, built on ``device``."""
    config = ZonosConfig.from_json(CONFIGS / f"zonos-v0.1-{kind}_config.json")
    with torch.device(device):
        model = Zonos(config, **kwargs)
    for name, p in model.state_dict().items():
        if name.endswith(("A_log", "dt_bias", "mixer.D")):
            continue  # the mixer's own initialization keeps decays and steps in range
        if name.endswith("weight") and p.ndim == 1:
            p.fill_(1.0)  # norms
        elif p.ndim == 1:
            p.zero_()
        else:
            p.normal_(0.0, p.shape[-1] ** -0.5 if "embed" not in name else 1.0)
    return model.to(dtype).eval()


@functools.cache
def _eos_barred(eos_token_id: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def bar_eos(logits: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        out = logits.clone()  # out of place: the engine keeps the result for this request's rows only
        out[:, 0, eos_token_id] = float("-inf")
        return out

    return bar_eos


def no_eos(model: Zonos) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A ``logits_processor`` for ``generate`` that keeps codebook 0 from sampling EOS, so every run generates
    exactly max_new_tokens frames. One object per EOS id: the engine keys its step graphs by the processors, so
    passing the same one to every request replays one graph."""
    return _eos_barred(model.eos_token_id)


def cuda_time(fn, reps: int = 5, warmup: int = 1) -> float:
    """Median wall seconds of ``fn()`` with the device synchronized around each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation."""
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def table(rows: list[dict], title: str) -> str:
    """A plain Markdown table of dict rows (same keys)."""
    keys = list(rows[0])
    out = [f"\n### {title}\n", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    return "\n".join(out)
