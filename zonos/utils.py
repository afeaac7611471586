"""Device defaults (also upstream's import path: ``from zonos.utils import DEFAULT_DEVICE``)."""

import torch


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on accelerators (what the checkpoints were trained and upstream runs in), fp32 on CPU."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


DEFAULT_DEVICE = default_device()
