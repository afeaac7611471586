"""Device defaults (also upstream's import path: ``from zonos.utils import DEFAULT_DEVICE``), tensor helpers,
building modules on the meta device, the command lines' help formatter and the warm-up's compile report."""

import argparse
import contextlib
import importlib.util
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on accelerators (what the checkpoints were trained and upstream runs in), fp32 on CPU."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


# Above this many rows, buckets are its multiples instead of powers of two: a step's cost grows with its rows, and
# 148 streams ran 256 rows in a power-of-two bucket. docs/BENCHMARKS.md, decisions: BUCKET_STEP
BUCKET_STEP = 32


def batch_buckets(n: int, step: int = BUCKET_STEP) -> tuple[int, ...]:
    """The batch sizes CUDA graphs are captured for, up to ``n``: 1, 2, 4, ... up to ``step``, then every multiple
    of ``step``, and ``n``. A batch of ``b`` runs in the smallest bucket that holds it: at most twice its size up to
    ``step``, at most ``step - 1`` rows more above."""
    powers = {2**i for i in range(step.bit_length())}
    return tuple(sorted(b for b in powers | set(range(step, n + 1, step)) | {n} if b <= n))


def tensor_version(t: torch.Tensor) -> int:
    """How many times ``t`` was changed in place (``t._version``); 0 for an inference tensor, which keeps no count
    (it can change only inside ``torch.inference_mode``, and such a change goes unseen by caches keyed on this)."""
    return 0 if t.is_inference() else t._version


# Initializers that would run on meta tensors through torch's Python reference kernels: the first such op imports
# torch._dynamo (with sympy), 1.2-4 s of a process's start. nn.init.normal_ is seen before it calls Tensor.normal_
# (inside this mode's handler the mode is off); kaiming_normal_ and xavier_normal_ reach Tensor.normal_ directly.
# Out-of-place elementwise ops on meta import it too, so module constructors keep to factories and in-place ops
# (docs/BENCHMARKS.md, "Where model ready goes").
_META_INITIALIZERS = frozenset({torch.nn.init.normal_, torch.Tensor.normal_})


class _SkipMetaInitializers(TorchFunctionMode):
    """Returns a meta tensor untouched from the random initializers in :data:`_META_INITIALIZERS`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _META_INITIALIZERS:
            t = args[0] if args else kwargs.get("tensor")
            if isinstance(t, torch.Tensor) and t.is_meta:
                return t
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Build modules on the meta device (shapes only, nothing allocated) without running an op in Python: random
    initializers of meta tensors are skipped, so the build does not import torch._dynamo."""
    with _SkipMetaInitializers(), torch.device("meta"):
        yield


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except the uninformative None and False ones (their help says what happens)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


DEFAULT_DEVICE = default_device()


@contextlib.contextmanager
def naming_compiles(bar) -> Iterator[None]:
    """While inside, show on the tqdm ``bar`` the name of each Triton kernel as it is compiled (or loaded from
    Triton's disk cache) in this process, whatever thread launches it (Triton's ``jit_cache_hook``, restored after;
    a hook already set is still called). Does nothing without triton."""
    if importlib.util.find_spec("triton") is None:
        yield
        return
    from triton import knobs

    previous = knobs.runtime.jit_cache_hook

    def hook(*, fn, **kwargs):
        bar.set_postfix_str(f"compiling {fn.name}", refresh=True)
        return previous(fn=fn, **kwargs) if previous is not None else None  # True would skip the compile

    knobs.runtime.jit_cache_hook = hook
    try:
        yield
    finally:
        knobs.runtime.jit_cache_hook = previous
