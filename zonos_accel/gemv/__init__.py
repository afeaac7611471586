"""CuTeDSL skinny GEMV for the decode-shaped projections, behind ``zonos.ops.linear`` (``use_cute_gemv``).

``gemv(x, weight)`` computes ``x @ weight.T`` for a few rows of x (fp32 accumulation, 16-bit out), streaming
each weight once, with one of two kernels that the tuned split picks per problem: FMAs in fp32 on the CUDA
cores (:class:`~zonos_accel.gemv.kernel.FmaGemv`) or ``mma.sync`` on the tensor cores
(:class:`~zonos_accel.gemv.kernel.MmaGemv`, whose cost does not grow with M).

``cute_gemv_backend(base)`` returns a :class:`zonos.ops.backend.Backend` whose ``linear`` sends a CUDA call with
at most ``max_rows`` rows of x (the decode step: batch × CFG rows) to the kernel, and everything else (prefill,
CPU tensors, other dtypes or layouts, autograd) to ``base``'s ``linear`` (cuBLAS on CUDA).

Costs: a kernel is compiled once per (M, N, K, dtype, split, device) on its first call (~0.3–1 s, keep
it out of CUDA-graph capture: the graph runner's warm-up step does that), and every call then spends
~30 µs on the host launching it, so the kernel pays inside a captured decode step, not in eager decoding.
"""

from __future__ import annotations

import functools
import importlib

import torch

from zonos.ops.backend import REFERENCE, Backend
from zonos_accel.gemv.config import MAX_ROWS, VEC, GemvConfig, gemv_config

INSTALL_HINT = "pip install nvidia-cutlass-dsl (or zonos-accel[gpu])"
DTYPES = (torch.bfloat16, torch.float16)
_INDEX_LIMIT = 2**31  # the kernel indexes elements with int32

_compiled: dict[tuple, object] = {}


def kernel_module():
    """:mod:`zonos_accel.gemv.kernel` (raises ImportError naming the missing package)."""
    try:
        return importlib.import_module("zonos_accel.gemv.kernel")
    except ImportError as e:
        raise ImportError(f"the CuTeDSL GEMV needs nvidia-cutlass-dsl ({e}); install it with {INSTALL_HINT}") from e


def _same_cuda_device(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.is_cuda and weight.device == x.device


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`gemv` can compute ``x @ weight.T`` (else the caller keeps ``F.linear``)."""
    if not _same_cuda_device(x, weight):
        return False
    if x.dtype not in DTYPES or weight.dtype != x.dtype or weight.dim() != 2 or x.dim() < 1:
        return False
    n, k = weight.shape
    if x.shape[-1] != k or k % VEC or n == 0 or x.numel() == 0:
        return False
    if not weight.is_contiguous() or weight.data_ptr() % 16:
        return False
    if n * k >= _INDEX_LIMIT or (x.numel() // k) * n >= _INDEX_LIMIT:
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))


def gemv(
    x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, config: GemvConfig | None = None
) -> torch.Tensor:
    """``x @ weight.T`` for x (..., K) and weight (N, K), both bf16 or both fp16, on one CUDA device.

    ``out`` (contiguous, shape (..., N), x's dtype) receives the result if given. ``config`` overrides the
    tuned work split (for benchmarks). Launches on the current stream, so it can be graph-captured.
    """
    if not supports(x, weight):
        raise ValueError(
            f"gemv takes x (..., K) and a contiguous, 16-byte aligned weight (N, K) of one dtype in {DTYPES}, "
            f"K a multiple of {VEC}, on one CUDA device, without autograd; got x {tuple(x.shape)} {x.dtype} "
            f"on {x.device}, weight {tuple(weight.shape)} {weight.dtype} on {weight.device}"
        )
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    if x2.data_ptr() % 16:
        x2 = x2.clone()
    m = x2.shape[0]
    if out is None:
        out = torch.empty(*x.shape[:-1], n, device=x.device, dtype=x.dtype)
    elif out.shape != (*x.shape[:-1], n) or out.dtype != x.dtype or not out.is_contiguous() or out.device != x.device:
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {(*x.shape[:-1], n)} on {x.device}")
    config = config or gemv_config(m, n, k)
    partial = torch.empty(config.splits, m, n, device=x.device, dtype=torch.float32) if config.splits > 1 else out
    if x.device.index == torch.cuda.current_device():
        _launch(x2, weight, out, partial, config)
    else:
        with torch.cuda.device(x.device):
            _launch(x2, weight, out, partial, config)
    return out


def _launch(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, partial: torch.Tensor, config: GemvConfig):
    kernel = kernel_module()
    dtype = kernel.CUTE_DTYPES[x.dtype]
    stream = torch.cuda.current_stream().cuda_stream
    args = kernel.launch_args(dtype, x.data_ptr(), weight.data_ptr(), out.data_ptr(), partial.data_ptr(), stream)
    m, k = x.shape
    key = (x.dtype, m, weight.shape[0], k, config, x.device.index)
    fn = _compiled.get(key)
    if fn is None:
        if torch.cuda.is_current_stream_capturing():  # loading a CUDA module would break the capture
            raise RuntimeError(
                f"the CuTeDSL GEMV for M={m}, N={weight.shape[0]}, K={k} ({x.dtype}) was first called inside "
                "CUDA-graph capture: call it once before capturing (a warm-up step) so it is compiled and loaded"
            )
        fn = _compiled[key] = kernel.compile_gemv(dtype, m, weight.shape[0], k, config, args)
    fn(*args)


def cute_gemv_backend(base: Backend = REFERENCE, max_rows: int = MAX_ROWS) -> Backend:
    """``base`` with ``linear`` calls of at most ``max_rows`` rows of x on the CuTeDSL GEMV (the rest on ``base``'s).

    Raises RuntimeError without a CUDA device and ImportError without nvidia-cutlass-dsl.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("the CuTeDSL GEMV (use_cute_gemv) needs a CUDA device, and torch sees none")
    if max_rows < 1:
        raise ValueError(f"max_rows must be positive, got {max_rows}")
    kernel_module()  # fail now, not at the first call
    fallback = base.op("linear")

    @functools.wraps(fallback)
    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows <= max_rows and supports(x, weight):
            y = gemv(x, weight)
            return y if bias is None else y.add_(bias)
        return fallback(x, weight, bias)

    return base.replace(f"{base.name}+cute_gemv", linear=linear)


__all__ = [
    "DTYPES",
    "GemvConfig",
    "cute_gemv_backend",
    "gemv",
    "gemv_config",
    "supports",
]
