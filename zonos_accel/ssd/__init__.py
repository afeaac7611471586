"""The Mamba2 SSD prefill scan in CuTeDSL (``use_cute_scan``), behind ``zonos.ops.ssd_scan``.

:func:`ssd_scan` has the reference's contract (:func:`zonos.ops.ssd.ssd_scan`). Each chunk of up to 256 tokens
is one launch of :class:`~zonos_accel.ssd.kernel.ChunkScan` over every (sequence, head): a Zonos prompt (60–125
tokens) is one launch per layer; longer sequences run one launch per 256 tokens, each starting from the fp32
state the previous one left (the chunk's boundary states never leave the GPU's memory in another dtype).

Shapes: x (b, l, h, p) bf16 with p ≤ 64 a multiple of 16, B and C (b, l, g, n) bf16 with n 64 or 128, dt
(b, l, h) and A, D (h,) in bf16 or fp32; strides as the mixer's views of one projection give them (unit
innermost stride, token and sequence strides multiples of 8 elements).

Measured on the H200 (``benchmarks/ssd_scan.py``: batch 2, 64 heads × 64, state 128, bf16 initial state, graph
replay): 0.019 / 0.035 / 0.160 / 0.699 ms at L = 100 / 256 / 1024 / 4096, against mamba_ssm's Triton combined
scan at 0.028 / 0.037 / 0.095 / 0.309 and the torch reference at 0.64 / 0.70 / 2.49 / 9.37: ahead of mamba_ssm
up to one chunk (1.49× at 100 tokens, 1.06× at 256), behind it past one (a launch of ~40 µs per 256 tokens).
Errors against float64: y 2.3e-3 (bf16 rounding of y and of the decayed C·Bᵀ), final state 2.6e-6.

A kernel is compiled once per (initial state: none, bf16 or fp32; p, n, device) on its first call, for any
length (the chunk's length is a runtime value): seconds, so call :func:`warmup` (or the scan once) before
CUDA-graph capture. Each launch costs ~30 µs on the host, so the scan pays inside a captured prefill.
"""

from __future__ import annotations

import importlib

import torch

from zonos.errors import ZonosInputError
from zonos.ops.ssd import check_scan_inputs

INSTALL_HINT = "pip install nvidia-cutlass-dsl (or 'zonos-accel[gpu]')"
CHUNK = 256  # tokens per launch (the kernel's shared memory holds them: 212 KB with an fp32 initial state)
_INDEX_LIMIT = 2**31  # the kernel indexes elements with int32
# Load C and B by cp.async and x and S0 in one batch of register loads before any shared-memory store
# (ChunkScan.batched_loads). H200, benchmarks/ssd_scan.py: 0.018 / 0.033 / 0.143 / 0.591 ms at L = 100 / 256 /
# 1024 / 4096 (1.54× / 1.12× / 0.67× / 0.52× mamba_ssm) against the per-vector loads' 0.019 / 0.035 / 0.160 /
# 0.699; both pass the scan's GPU tests, at Zonos shapes and ragged ones (H100). docs/BENCHMARKS.md, decisions.
BATCHED_LOADS = True

_compiled: dict[tuple, object] = {}


def kernel_module():
    """:mod:`zonos_accel.ssd.kernel` (raises ImportError naming the missing package)."""
    try:
        return importlib.import_module("zonos_accel.ssd.kernel")
    except ImportError as e:
        raise ImportError(
            f"the CuTeDSL SSD scan (use_cute_scan) needs nvidia-cutlass-dsl ({e}); install it with {INSTALL_HINT}"
        ) from e


def require_cute_scan() -> None:
    """Raise unless this process can run the CuTeDSL scan: RuntimeError without a CUDA device (or below sm_80),
    ImportError without nvidia-cutlass-dsl."""
    if not torch.cuda.is_available():
        raise RuntimeError("the CuTeDSL SSD scan (use_cute_scan) needs a CUDA device, and torch sees none")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        raise RuntimeError(f"the CuTeDSL SSD scan (use_cute_scan) needs an sm_80 or newer GPU, not sm_{major}{minor}")
    kernel_module()


def _check(x, dt, A, B, C, chunk_size, D, initial_state) -> None:
    """ZonosInputError naming the input unless the kernel takes these tensors as they are."""
    check_scan_inputs(x, dt, A, B, C, chunk_size, D, initial_state)
    p, n = x.shape[3], B.shape[3]
    if x.dtype != torch.bfloat16 or B.dtype != x.dtype or C.dtype != x.dtype:
        raise ZonosInputError(f"the CuTeDSL ssd_scan takes bf16 x, B and C, got {x.dtype}, {B.dtype}, {C.dtype}")
    for name, t in (("dt", dt), ("A", A), ("D", D), ("initial_state", initial_state)):
        if t is not None and t.dtype not in (torch.bfloat16, torch.float32):
            raise ZonosInputError(f"the CuTeDSL ssd_scan takes {name} in bf16 or fp32, got {t.dtype}")
    if not cute_scan_fits(p, n):
        raise ZonosInputError(
            f"the CuTeDSL ssd_scan takes head dim p ≤ 64 (a multiple of 16) and state 64 or 128, got {p}, {n}"
        )
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("initial_state", initial_state)):
        if t is not None and t.device != x.device:
            raise ZonosInputError(f"ssd_scan: {name} is on {t.device}, x on {x.device}: put every input on one device")


def _vector_rows(t: torch.Tensor, inner: int) -> torch.Tensor:
    """t with its innermost ``inner`` elements contiguous at 16-byte aligned row starts (a copy only if not)."""
    ok = t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] and all(s % 8 == 0 for s in t.stride()[:2])
    ok = ok and t.data_ptr() % 16 == 0 and t.shape[-1] * t.shape[-2] == inner
    return t if ok else t.contiguous()


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`zonos.ops.ssd.ssd_scan`: y (b, l, h, p) in x's dtype and the final state (b, h, p, n)
    in fp32. ``chunk_size`` is checked but does not change the blocking (the result does not depend on it): every
    launch covers up to :data:`CHUNK` tokens. Launches on the current stream, so it can be graph-captured once
    each padded chunk length has been compiled (call it once before capturing)."""
    _check(x, dt, A, B, C, chunk_size, D, initial_state)
    if not x.is_cuda:
        hint = "" if torch.cuda.is_available() else " and torch sees none (use the reference, zonos.ops.ssd_scan)"
        raise RuntimeError(f"the CuTeDSL SSD scan (use_cute_scan) needs CUDA tensors, got x on {x.device}{hint}")
    kernel = kernel_module()
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    final = torch.empty(b, h, p, n, device=x.device, dtype=torch.float32)
    y = torch.empty(b, l, h, p, device=x.device, dtype=x.dtype)
    if l == 0 or b == 0:
        final.copy_(initial_state if initial_state is not None else torch.zeros_like(final))
        return y, final
    x = _vector_rows(x, h * p)
    B, C = _vector_rows(B, g * n), _vector_rows(C, g * n)
    dt, A = dt.float().contiguous(), A.float().contiguous()  # small: one compiled kernel for any of their dtypes
    D = D.float().contiguous() if D is not None else torch.zeros_like(A)
    state = initial_state.contiguous() if initial_state is not None else None
    if state is not None and state.data_ptr() % 16:  # the kernel loads it in 128-bit vectors
        state = state.clone()
    if max(x.stride(0), B.stride(0), C.stride(0), dt.stride(0), y.stride(0)) * b >= _INDEX_LIMIT:
        raise ZonosInputError(f"ssd_scan: {b} × {l} tokens exceed the kernel's int32 indexing: split the batch")
    with torch.cuda.device(x.device):
        stream = torch.cuda.current_stream().cuda_stream
        for c0 in range(0, l, CHUNK):
            length = min(CHUNK, l - c0)
            s0 = state if state is not None else final  # unread without an initial state
            strides = (x.stride(0), x.stride(1), dt.stride(0), dt.stride(1), B.stride(0), B.stride(1))
            strides += (C.stride(0), C.stride(1), y.stride(0), y.stride(1))
            args = kernel.launch_args(
                x[:, c0:], dt[:, c0:], A, B[:, c0:], C[:, c0:], D, s0, y[:, c0:], final, length, strides, h // g, stream
            )
            key = (None if state is None else state.dtype, p, n, BATCHED_LOADS, x.device.index)
            fn = _compiled.get(key)
            if fn is None:
                if torch.cuda.is_current_stream_capturing():  # loading a CUDA module would break the capture
                    raise RuntimeError(
                        f"the CuTeDSL SSD scan ({key[0]} initial state) was first called inside CUDA-graph capture: "
                        "call it once before capturing (a warm-up prefill) so it is compiled and loaded"
                    )
                fp32_state = state is not None and state.dtype == torch.float32
                scan = kernel.ChunkScan(p, n, state is not None, fp32_state, BATCHED_LOADS)
                fn = _compiled[key] = kernel.compile_scan(scan, args)
            fn(*args)
            state = final  # the next chunk starts from this one's fp32 state, updated in place
    return y, final


def warmup(p: int = 64, n: int = 128, device: torch.device | None = None) -> None:
    """Compile the three kernels a prefill may use (no, bf16 and fp32 initial state; any length) by running each
    once on a small input, so no compile happens inside a request or a graph capture."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    x = torch.zeros(1, 16, 1, p, device=device, dtype=torch.bfloat16)
    dt, A = torch.zeros(1, 16, 1, device=device), torch.zeros(1, device=device)
    Bm = torch.zeros(1, 16, 1, n, device=device, dtype=torch.bfloat16)
    for init in (None, torch.bfloat16, torch.float32):
        s0 = None if init is None else torch.zeros(1, 1, p, n, device=device, dtype=init)
        ssd_scan(x, dt, A, Bm, Bm, CHUNK, initial_state=s0)


def cute_scan_fits(p: int, n: int) -> bool:
    """Whether the kernel takes a mixer of head dim ``p`` and state size ``n`` (Zonos-v0.1-hybrid: 64 and 128)."""
    return 0 < p <= 64 and p % 16 == 0 and n in (64, 128)


def cute_scan_available() -> bool:
    """Whether this process can run the CuTeDSL scan (what ``use_cute_scan=None`` turns it on for): a CUDA device of
    sm_80 or newer and an importable nvidia-cutlass-dsl."""
    try:
        require_cute_scan()
    except (ImportError, RuntimeError):
        return False
    return True


def cute_scan_backend(base):
    """``base`` (a :class:`zonos.ops.backend.Backend`) with its prefill scans on CUDA tensors on the CuTeDSL kernel
    (``use_cute_scan``), at any length. The engine prefills in pieces of at most :data:`CHUNK` tokens
    (``zonos_accel.graphs.MAX_PIECE``), each one launch per layer, so a request's scan never runs the chunk loop
    that trails mamba_ssm's (the module's docstring). Raises as :func:`require_cute_scan` does."""
    require_cute_scan()
    fallback = base.op("ssd_scan")

    def scan(x, dt, A, B, C, chunk_size, D=None, initial_state=None):
        if x.is_cuda:
            return ssd_scan(x, dt, A, B, C, chunk_size, D=D, initial_state=initial_state)
        return fallback(x, dt, A, B, C, chunk_size, D=D, initial_state=initial_state)

    return base.replace(f"{base.name}+cute_scan", ssd_scan=scan)


__all__ = [
    "BATCHED_LOADS",
    "CHUNK",
    "cute_scan_available",
    "cute_scan_backend",
    "cute_scan_fits",
    "kernel_module",
    "require_cute_scan",
    "ssd_scan",
    "warmup",
]
