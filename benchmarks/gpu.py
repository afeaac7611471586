"""GPU measurement helpers for the decode benchmarks: the real-size model they time, the read-bandwidth
ceiling, CUDA-event timing, the op backend switch, and the environment line each report starts with."""

from __future__ import annotations

import datetime
import statistics

import torch
from common import random_model, suppress_eos, table

FRAME_MS = 11.61  # one frame of audio: 512 samples at 44.1 kHz


def real_size_model(max_seqlen: int = 4096):
    """Zonos-v0.1-hybrid in bf16 on CUDA with random weights, EOS suppressed so every run lasts its length."""
    torch.manual_seed(0)
    model = random_model("hybrid", max_seqlen=max_seqlen)
    suppress_eos(model)
    return model


def tiny_model(max_seqlen: int = 512, seed: int = 0, autoencoder=None):
    """The CPU tests' tiny hybrid (``tests/tiny.py``) in fp32 on the CPU with random weights, for the
    ``--device cpu --tiny`` smoke runs of GPU benchmarks (needs the repository root on the path)."""
    from tests.tiny import random_state_dict, tiny_config
    from zonos.config import ZonosConfig
    from zonos.model import Zonos

    torch.manual_seed(seed)
    model = Zonos(ZonosConfig.from_dict(tiny_config("hybrid")), autoencoder=autoencoder, max_seqlen=max_seqlen)
    model.load_state_dict(random_state_dict(model, seed))
    return model.eval()


def event_times(fn, repeat: int, warmup: int = 3) -> list[float]:
    """GPU milliseconds of each of ``repeat`` calls of ``fn`` (CUDA events, no host sync between calls)."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def read_bandwidth_gbs(gib: int = 4) -> float:
    """Device read bandwidth from a sum over ``gib`` GiB of bf16 (median of 10)."""
    x = torch.empty(gib * 2**29, device="cuda", dtype=torch.bfloat16).normal_()
    ms = event_times(x.sum, repeat=10, warmup=2)
    return x.numel() * 2 / (statistics.median(ms) * 1e-3) / 1e9


OPS_KINDS = ("torch", "triton", "triton-nopdl", "triton+gemv")


def set_ops(kind: str) -> None:
    """``torch``: the reference ops; ``triton``: every Triton fast path (mamba_ssm's and ours, ours launched
    with programmatic dependent launch); ``triton-nopdl``: the same without PDL; ``triton+gemv``: the Triton
    paths plus the CuTeDSL GEMV for the decode projections (``use_cute_gemv``)."""
    from zonos_accel.gemv import disable_cute_gemv, enable_cute_gemv
    from zonos_accel.triton import disable_triton_ops, enable_triton_ops, pdl

    if kind not in OPS_KINDS:
        raise ValueError(f"unknown op backend {kind!r}; known: {OPS_KINDS}")
    disable_triton_ops()
    disable_cute_gemv()
    pdl.ENABLED = kind != "triton-nopdl"
    if kind.startswith("triton"):
        enable_triton_ops()
    if kind.endswith("+gemv"):
        enable_cute_gemv()


def environment() -> str:
    import triton

    try:
        import mamba_ssm

        mamba = mamba_ssm.__version__
    except ImportError:
        mamba = "absent"
    return (
        f"{torch.cuda.get_device_name()} | torch {torch.__version__} (CUDA {torch.version.cuda}) | "
        f"triton {triton.__version__} | mamba_ssm {mamba} | {datetime.date.today()}"
    )


def report(title: str, header: list[str], rows: list[list]) -> str:
    """A Markdown table of rows (values formatted by the caller) under ``title``."""
    return table([dict(zip(header, r)) for r in rows], title) + "\n"
