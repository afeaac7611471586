"""Checkpoint reading and strict checks shared by every loader (model, codec, speaker embedding)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from zonos.errors import CheckpointError

__all__ = ["MAX_LISTED", "CheckpointMismatchError", "check_finite_state_dict", "check_state_dict", "load_safetensors"]

MAX_LISTED = 10  # names shown per kind of problem


class CheckpointMismatchError(CheckpointError):
    """A checkpoint's tensor names or shapes do not fit the model built from its config, or hold NaN/inf."""


def load_safetensors(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """Every tensor of a ``.safetensors`` file, as a dict on ``device``.

    A missing, truncated or corrupt file raises :class:`~zonos.errors.CheckpointError` that names it and says
    to download it again (safetensors' own errors, e.g. "incomplete metadata", name neither).
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; pass the model.safetensors of a downloaded checkpoint")
    state = {}
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for key in f.keys():
                state[key] = f.get_tensor(key)
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({type(e).__name__}: {e}); it is probably truncated or "
            "corrupted (an interrupted download): delete it and download it again"
        ) from None
    return state


def check_finite_state_dict(
    state: Mapping[str, Tensor], source: str, error: type[CheckpointMismatchError] = CheckpointMismatchError
) -> None:
    """Raise ``error`` (a :class:`CheckpointMismatchError`) naming ``source`` and the tensors holding NaN or infinities
    (such weights make every output NaN, which sampling turns into silent all-zero codes)."""
    bad = [
        name
        for name, t in state.items()
        if isinstance(t, Tensor) and t.is_floating_point() and t.numel() and not bool(t.isfinite().all())
    ]
    if bad:
        listed = ", ".join(bad[:MAX_LISTED]) + (f" and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else "")
        raise error(
            f"{source} has NaN or infinite values in {len(bad)} tensor(s): {listed}. The file is corrupted "
            "(or was saved from a diverged run): download it again"
        )


def check_state_dict(
    expected: Mapping[str, Tensor],
    given: Mapping[str, Tensor],
    source: str,
    model: str,
    hint: str,
    error: type[CheckpointMismatchError] = CheckpointMismatchError,
) -> None:
    """Raise one ``error`` listing every missing, unexpected and mis-shaped tensor (torch's own error stops
    at the first shape mismatch), then check that every floating tensor is finite
    (:func:`check_finite_state_dict`). ``source`` names the checkpoint, ``model`` what it was loaded into,
    ``hint`` what to check."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    misshaped = sorted(
        f"{k}: checkpoint {tuple(given[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(expected) & set(given)
        if tuple(given[k].shape) != tuple(expected[k].shape)
    )
    if not (missing or unexpected or misshaped):
        check_finite_state_dict(given, source, error)
        return
    lines = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
        lines += [f"  {label}: {n}" for n in names[:MAX_LISTED]]
        if len(names) > MAX_LISTED:
            lines.append(f"  ... and {len(names) - MAX_LISTED} more {label}")
    raise error(
        f"{source} does not fit {model} ({len(missing)} missing, {len(unexpected)} unexpected, "
        f"{len(misshaped)} mis-shaped tensors). {hint}\n" + "\n".join(lines)
    )
