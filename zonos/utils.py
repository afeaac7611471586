"""Device defaults (also upstream's import path: ``from zonos.utils import DEFAULT_DEVICE``), tensor helpers and
the command lines' help formatter."""

import argparse

import torch


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on accelerators (what the checkpoints were trained and upstream runs in), fp32 on CPU."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


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
