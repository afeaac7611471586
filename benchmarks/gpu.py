"""GPU measurement helpers for the decode benchmarks: the real-size model they time, the read-bandwidth
ceiling, CUDA-event timing, the op backend choice, the engine's captured decode step, and the environment line
each report starts with."""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable

import torch
from common import random_model, table

FRAME_MS = 11.61  # one frame of audio: 512 samples at 44.1 kHz


def real_size_model(max_seqlen: int = 4096):
    """Zonos-v0.1-hybrid in bf16 on CUDA with random weights (pass ``logits_processor=no_eos(model)`` to
    ``generate`` so every run lasts its length)."""
    torch.manual_seed(0)
    return random_model("hybrid", max_seqlen=max_seqlen)


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


def graph_us(calls, replays: int = 20) -> float:
    """Median µs of one call of ``calls`` (a list of thunks), replayed as one CUDA graph captured on a side stream
    (the first two called once before, to compile and pick kernels outside the capture)."""
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        for c in calls:
            c()
    return statistics.median(event_times(graph.replay, repeat=replays, warmup=3)) * 1e3 / len(calls)


def read_bandwidth_gbs(gib: int = 4) -> float:
    """Device read bandwidth from a sum over ``gib`` GiB of bf16 (median of 10)."""
    x = torch.empty(gib * 2**29, device="cuda", dtype=torch.bfloat16).normal_()
    ms = event_times(x.sum, repeat=10, warmup=2)
    return x.numel() * 2 / (statistics.median(ms) * 1e-3) / 1e9


OPS_KINDS = ("torch", "triton", "triton-nopdl", "triton+gemv", "triton+sampler", "triton+gemv+sampler",
             "triton+sampler+blocks", "triton+gemv+sampler+blocks", "triton+sampler+blocks+ssm")  # fmt: skip


def use_ops(model, kind: str, cuda_graphs: bool = True) -> None:
    """Give ``model`` the op backend ``kind`` through ``use_accelerators``: ``torch``: the reference ops;
    ``triton``: every Triton fast path (ours, launched with programmatic dependent launch); ``triton-nopdl``: the
    same without PDL; ``triton+gemv``: the Triton paths plus the CuTeDSL GEMV for the decode projections
    (``use_cute_gemv``); ``+sampler``: plus the fused sampler (``fused_sampling``); ``+blocks``: plus every block's
    decode step through fused GEMVs (``fused_blocks``); ``+ssm``: with the Mamba2 state update inside in_proj's
    launch (``mamba_block.SSM_IN_PROJ``, read as the new backend's graphs are captured). The next request runs it
    (and captures its graphs)."""
    from zonos_accel.triton import mamba_block, pdl

    if kind not in OPS_KINDS:
        raise ValueError(f"unknown op backend {kind!r}; known: {OPS_KINDS}")
    pdl.ENABLED = kind != "triton-nopdl"
    mamba_block.SSM_IN_PROJ = "+ssm" in kind
    model.use_accelerators(
        fast_ops=kind.startswith("triton"),
        cuda_graphs=cuda_graphs,
        use_cute_gemv="+gemv" in kind,
        fused_sampling="+sampler" in kind,
        fused_blocks="+blocks" in kind,
    )


def decode_step(model, sampling_params: dict, processors: tuple = ()) -> Callable[[], None]:
    """The engine's decode step over its first slot, as a function that replays its CUDA graph (what a request
    alone with these sampling parameters and logits processors runs; captured now on a side stream if no request
    has). Call it inside ``model.engine.idle()``. The slot's request has ended, so a replay computes a full step
    at the slot's last position and changes nothing a request reads."""
    from zonos.ops.sampler import features
    from zonos.sampling import SamplingParams

    engine = model.engine
    if engine.graphs is None:
        raise ValueError("the model runs without CUDA graphs: use_accelerators(cuda_graphs=True) first")
    use = features([SamplingParams.from_dict(sampling_params)])

    def step() -> None:
        engine.graphs.step(engine.slots, 1, use, processors, model.backbone.ops)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with engine.idle(), torch.cuda.stream(side):
        step()
        step()  # the first call of a new key runs eagerly and captures; this one replays
    torch.cuda.synchronize()
    return step


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
