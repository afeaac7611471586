"""Import and device checks shared by our Triton kernels' torch-facing functions, and their compile for a named GPU
without one (:func:`compile_for`)."""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError as e:  # the GPU extra is not installed
    raise ImportError(
        f"zonos_accel's Triton kernels need triton ({e}); install it with pip install 'zonos-accel[gpu]'"
    ) from e

__all__ = ["check_tensors", "compile_for", "interpreting", "tl", "triton"]


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, read when triton is imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_tensors(op: str, **tensors: torch.Tensor | None) -> None:
    """Raise a RuntimeError naming ``op`` and the tensor unless every given tensor is on one CUDA device (or on
    the CPU under Triton's interpreter)."""
    device = None
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device.type != "cuda" and not (interpreting() and t.device.type == "cpu"):
            hint = "" if torch.cuda.is_available() else " (torch sees no CUDA device: use the reference in zonos.ops)"
            raise RuntimeError(f"the Triton kernel of {op} needs CUDA tensors, got {name} on {t.device}{hint}")
        if device is None:
            device = t.device
        elif t.device != device:
            raise RuntimeError(
                f"the Triton kernel of {op} needs all tensors on one device: {name} is on {t.device}, not {device}"
            )


def compile_for(kernel, types: dict[str, str], constexprs: dict, num_warps: int, arch: int = 90):
    """Compile ``kernel`` (a JITFunction) for CUDA compute capability ``arch`` on any machine, GPU or not: its
    arguments typed by ``types`` (Triton's names, e.g. ``"*bf16"``, ``"fp32"``; others ``"i32"``) and
    ``constexprs``. Returns Triton's compiled kernel (its ``asm["cubin"]`` is ptxas's output)."""
    import inspect

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = inspect.signature(kernel.fn).parameters
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    target = GPUTarget("cuda", arch, 32)
    return triton.compile(ASTSource(kernel, signature, constexprs), target=target, options={"num_warps": num_warps})
