"""Device defaults (also upstream's import path: ``from zonos.utils import DEFAULT_DEVICE``), tensor helpers,
the command lines' help formatter and the warm-up's compile report."""

import argparse
import contextlib
import importlib.util
from collections.abc import Iterator

import torch


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on accelerators (what the checkpoints were trained and upstream runs in), fp32 on CPU."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def power_buckets(n: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``n``, and ``n``: the batch sizes CUDA graphs are captured for, so that a batch of ``b``
    runs in the smallest bucket that holds it (at most twice its size)."""
    return tuple(sorted({min(2**i, n) for i in range(n.bit_length() + 1)}))


def tensor_version(t: torch.Tensor) -> int:
    """How many times ``t`` was changed in place (``t._version``); 0 for an inference tensor, which keeps no count
    (it can change only inside ``torch.inference_mode``, and such a change goes unseen by caches keyed on this)."""
    return 0 if t.is_inference() else t._version


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
