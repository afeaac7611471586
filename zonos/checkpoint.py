"""Strict checkpoint checks shared by every loader (model, codec, speaker embedding)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

MAX_LISTED = 10  # names shown per kind of problem


class CheckpointMismatchError(ValueError):
    """A checkpoint's tensor names or shapes do not fit the model built from its config."""


def check_state_dict(
    expected: Mapping[str, Tensor],
    given: Mapping[str, Tensor],
    source: str,
    model: str,
    hint: str,
    error: type[CheckpointMismatchError] = CheckpointMismatchError,
) -> None:
    """Raise one ``error`` listing every missing, unexpected and mis-shaped tensor (torch's own error stops
    at the first shape mismatch). ``source`` names the checkpoint, ``model`` what it was loaded into,
    ``hint`` what to check."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    misshaped = sorted(
        f"{k}: checkpoint {tuple(given[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(expected) & set(given)
        if tuple(given[k].shape) != tuple(expected[k].shape)
    )
    if not (missing or unexpected or misshaped):
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
