"""Adapters from Zonos's op boundary to mamba_ssm's Triton kernels: an optional backend, and the reference the
benchmarks compare ours against (benchmarks/ssd_scan.py, benchmarks/mamba_decode_ops.py).

The default GPU path needs no mamba_ssm: our Triton kernels cover the state update
(:mod:`zonos_accel.triton.state_update`) and the gated RMSNorm (:mod:`zonos_accel.triton.gated_norm`), the
CuTeDSL scan (:mod:`zonos_accel.ssd`) or the torch reference the prefill scan. mamba_ssm is not in the ``gpu``
extra (its sdist builds CUDA extensions with nvcc); it is imported on first use, through :func:`mamba_module`,
which says how to install it when it is missing.

Each function keeps the contract of its reference in :mod:`zonos.ops`.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Iterator

import torch

from zonos.ops.precision import compute_dtype

INSTALL_HINT = "pip install 'zonos-accel[gpu]'"  # triton and nvidia-cutlass-dsl, wheels only
MAMBA_HINT = "pip install mamba-ssm --no-build-isolation (it builds with nvcc; Zonos runs without it)"


@functools.cache
def mamba_module(name: str):
    """``mamba_ssm.ops.triton.<name>``, or an ImportError that says what to install."""
    try:
        module = importlib.import_module(f"mamba_ssm.ops.triton.{name}")
    except ImportError as e:
        raise ImportError(
            f"this fast path needs the mamba_ssm package (its Triton kernels), which failed to import ({e}); "
            f"install it with {MAMBA_HINT}"
        ) from e
    _keep_autotuning_on_disk()
    return module


def _keep_autotuning_on_disk() -> None:
    """Store the autotuning results of mamba_ssm's kernels in Triton's on-disk cache, beside the compiled
    kernels (what TRITON_CACHE_AUTOTUNING=1 does for every kernel). Without it each new process benchmarks the
    SSD scan's configs again in its first prefill: 6.5 s of a warm process's first request on the H200
    (benchmarks/first_request.py; docs/BENCHMARKS.md, first request)."""
    for tuner in mamba_autotuners():
        tuner.cache_results = True


def mamba_autotuners() -> Iterator:
    """The Triton autotuners of the mamba_ssm kernel modules imported so far."""
    from triton.runtime.autotuner import Autotuner

    for name, module in list(sys.modules.items()):
        if name.startswith("mamba_ssm.ops.triton.") and module is not None:
            for obj in vars(module).values():
                while hasattr(obj, "fn"):  # through heuristics wrappers to the autotuner, if any
                    if isinstance(obj, Autotuner):
                        yield obj
                    obj = obj.fn


_zero_bias: dict[tuple, torch.Tensor] = {}


def ssd_step(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
) -> torch.Tensor:
    """:func:`zonos.ops.ssd.ssd_step` as mamba_ssm's ``selective_state_update`` (one launch, the dt bias and
    softplus included).

    dt (b, h), dt_bias and A (h,) are broadcast over the head dimension with stride-0 views, which the
    kernel recognises (one step size and one decay per head, as in Mamba2).
    """
    b, h, p = x.shape
    n = state.shape[-1]
    if dt_bias is None:
        key = (h, x.device)
        if key not in _zero_bias:
            _zero_bias[key] = torch.zeros(h, device=x.device, dtype=torch.float32)
        dt_bias = _zero_bias[key]
    update = mamba_module("selective_state_update").selective_state_update
    return update(
        state,
        x,
        dt[..., None].expand(b, h, p),
        A[:, None, None].expand(h, p, n),
        B,
        C,
        D=None if D is None else D[:, None].expand(h, p),
        dt_bias=dt_bias[:, None].expand(h, p),
        dt_softplus=dt_softplus,
    )


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int) -> torch.Tensor:
    """:func:`zonos.ops.norms.gated_rms_norm` as mamba_ssm's fused gated RMSNorm (gate before the norm)."""
    shape = x.shape
    rmsnorm_fn = mamba_module("layernorm_gated").rmsnorm_fn
    y = rmsnorm_fn(
        x.reshape(-1, shape[-1]),
        weight,
        None,
        z=z.reshape(-1, shape[-1]),
        eps=eps,
        group_size=group_size,
        norm_before_gate=False,
    )
    return y.reshape(shape)


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
    """:func:`zonos.ops.ssd.ssd_scan` as mamba_ssm's ``mamba_chunk_scan_combined``."""
    combined = mamba_module("ssd_combined").mamba_chunk_scan_combined
    y, final = combined(x, dt, A, B, C, chunk_size, D=D, initial_states=initial_state, return_final_states=True)
    return y, final.to(compute_dtype(x.dtype))
