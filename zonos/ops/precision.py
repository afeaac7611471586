"""Internal precision of the reference ops."""

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types and float32, float64 for float64: references never compute below fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
