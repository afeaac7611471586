"""One directory for the compiled GPU kernels of every compiler Zonos uses, so that a machine compiles each
kernel once and later processes load it from disk (a fresh machine otherwise spends about a minute compiling
before its first audio).

Two compilers run here: Triton (our kernels and mamba_ssm's, the small host-side launcher Triton builds per
kernel, and the autotuning results that zonos_accel.triton.mamba keeps beside them) and CuTeDSL
(``nvidia-cutlass-dsl``: the ``--cute-gemv`` / ``--cute-scan`` kernels); torch's inductor is not used.
:func:`use_kernel_cache` points both at subdirectories of one root, through the variables they read:
``TRITON_CACHE_DIR`` (Triton reads it, through ``triton.knobs.cache.dir``, on every compile) and
``CUTE_DSL_CACHE_DIR`` (CuTeDSL's file cache of compiled modules; nvidia-cutlass-dsl 4.3 reads it once, when
``cutlass`` is first imported, so the call must come before that import).

The root is, first to last: the ``path`` given to :func:`use_kernel_cache`; the ``ZONOS_KERNEL_CACHE``
variable; ``$XDG_CACHE_HOME/zonos/kernels`` (``~/.cache/zonos/kernels``). With the default root a compiler's
own variable that is already set is kept, so an existing ``TRITON_CACHE_DIR`` still works; a root chosen with
``path`` or ``ZONOS_KERNEL_CACHE`` replaces them. Nothing here imports torch, Triton or CuTeDSL.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path

from zonos.errors import ZonosInputError

__all__ = ["ENV_VAR", "KernelCache", "default_kernel_cache", "kernel_cache_dirs", "use_kernel_cache"]

ENV_VAR = "ZONOS_KERNEL_CACHE"
_TRITON_VAR = "TRITON_CACHE_DIR"
_CUTE_VAR = "CUTE_DSL_CACHE_DIR"


@dataclasses.dataclass(frozen=True)
class KernelCache:
    """Where this process keeps compiled kernels: the ``root`` and each compiler's directory."""

    root: Path
    triton: Path
    cutedsl: Path

    def describe(self) -> str:
        """One line for a status message: the root, and any compiler directory outside it."""
        dirs = (("Triton", self.triton), ("CuTeDSL", self.cutedsl))
        outside = [f"{name} in {d}" for name, d in dirs if not d.is_relative_to(self.root)]
        return str(self.root) + (f" ({', '.join(outside)})" if outside else "")


_applied: KernelCache | None = None


def default_kernel_cache() -> Path:
    """The root used when neither a path nor ``ZONOS_KERNEL_CACHE`` is given: ``$XDG_CACHE_HOME/zonos/kernels``,
    ``XDG_CACHE_HOME`` defaulting to ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "zonos" / "kernels"


def kernel_cache_dirs(path: str | os.PathLike[str] | None = None) -> KernelCache:
    """Where :func:`use_kernel_cache` with this ``path`` would keep the kernels (see the module's docstring for
    which root wins); changes nothing."""
    return _resolve(path)[0]


def use_kernel_cache(path: str | os.PathLike[str] | None = None) -> KernelCache:
    """Keep this process's compiled Triton and CuTeDSL kernels under one root (see the module's docstring for
    which root wins), creating the directories; returns where each compiler's kernels go.

    Call it before the model loads: once CuTeDSL is imported its directory may be fixed, and a process keeps
    one kernel cache (kernels compiled earlier went to the first one). Calling it again with the same root, or
    with neither ``path`` nor ``ZONOS_KERNEL_CACHE`` (a front end's default), keeps the cache chosen first.

    Raises:
        ZonosInputError: a directory cannot be created or written; or this process already uses another root,
            or CuTeDSL was imported with another directory.
    """
    global _applied
    if _applied is not None and path is None and not os.environ.get(ENV_VAR):
        return _applied
    cache, origin = _resolve(path)
    if _applied == cache:
        return cache
    if _applied is not None:
        raise ZonosInputError(
            f"{origin}: this process already keeps its kernels in {_applied.describe()}, and kernels compiled "
            "since went there; a process has one kernel cache: choose it once, before the model loads (or start a "
            "new process for another)"
        )
    frozen = _frozen_cute_dir()
    if frozen is not None and frozen != cache.cutedsl:
        raise ZonosInputError(
            f"{origin}: CuTeDSL (nvidia-cutlass-dsl) was imported before, and keeps its kernels in {frozen} for "
            "the rest of this process; choose the kernel cache before anything imports cutlass (call "
            f"use_kernel_cache before loading the model), or set {ENV_VAR} in the environment"
        )
    for d in (cache.triton, cache.cutedsl):
        _check_writable(d, origin)
    os.environ[_TRITON_VAR] = str(cache.triton)
    os.environ[_CUTE_VAR] = str(cache.cutedsl)
    if "triton" in sys.modules:
        # A directory assigned to triton.knobs.cache.dir in Python outranks the variable: replace it too.
        from triton import knobs

        if knobs.cache.dir != str(cache.triton):
            knobs.cache.dir = str(cache.triton)
    _applied = cache
    return cache


def _resolve(path: str | os.PathLike[str] | None) -> tuple[KernelCache, str]:
    """The kernel cache for ``path``, and how its root was chosen (for error messages)."""
    if path is not None:
        root, origin = Path(path), f"kernel cache {path}"
    elif os.environ.get(ENV_VAR):
        root, origin = Path(os.environ[ENV_VAR]), f"{ENV_VAR}={os.environ[ENV_VAR]}"
    else:
        root = default_kernel_cache()
        origin = f"the default kernel cache {root} (set {ENV_VAR} to choose another)"
    root = root.expanduser().absolute()
    keep_own = path is None and not os.environ.get(ENV_VAR)
    cache = KernelCache(
        root=root,
        triton=_compiler_dir(root / "triton", _TRITON_VAR, keep_own),
        cutedsl=_compiler_dir(root / "cutedsl", _CUTE_VAR, keep_own),
    )
    return cache, origin


def _compiler_dir(default: Path, var: str, keep_own: bool) -> Path:
    """``default``, or the compiler's own variable ``var`` when ``keep_own`` and it is set."""
    own = os.environ.get(var)
    return Path(own).expanduser().absolute() if keep_own and own else default


def _frozen_cute_dir() -> Path | None:
    """The directory an already-imported CuTeDSL fixed at import (4.3 reads ``CUTE_DSL_CACHE_DIR`` once, into
    ``cache_helpers.default_generated_ir_path``); None when it is not imported, or reads the variable at each
    compile (later releases, e.g. 4.8: ``cache_helpers.get_default_generated_ir_path``)."""
    helpers = sys.modules.get("cutlass.base_dsl.cache_helpers")
    if helpers is None or hasattr(helpers, "get_default_generated_ir_path"):
        return None
    return Path(helpers.default_generated_ir_path).absolute()


def _check_writable(directory: Path, origin: str) -> None:
    """Create ``directory`` and write a file into it (a read-only mount passes a permission check but fails
    here); raises :class:`ZonosInputError` naming it and the fix."""
    fix = (
        f"make it writable, or choose another directory ({ENV_VAR}=DIR in the environment, --kernel-cache DIR on "
        "the command line, or use_kernel_cache(DIR))"
    )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise ZonosInputError(
            f"{origin}: cannot write compiled kernels into {directory} ({e.strerror or e}); {fix}"
        ) from None
