"""Small reusable input checks for the public API, each raising :class:`~zonos.errors.ZonosInputError` with a
message that names the input, says what is wrong and how to fix it.

They run before any expensive work: a bad value should cost microseconds, not a forward pass. Tensor checks read
one reduction back to the host (``isfinite(...).all()``); callers on a hot CUDA path run them once per request,
never per decode step.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from zonos.errors import ZonosInputError

# Guidance past this overflows the logits' float32 arithmetic (a scale of 1e300 is not even a float32); a scale of
# 1e4 already leaves the unconditional logits no say.
MAX_CFG_SCALE = 1e4
# prepare_conditioning's prefix ends in the conditioner's LayerNorm, so its values are O(1); one of 1e20 is finite
# but drives the backbone's activations to inf, so every logit is NaN and every code 0.
MAX_PREFIX_ABS = 1e4
MAX_BATCH = 65_536  # generate(batch_size=B) draws B seeds before the engine checks memory: 1e8 took 16 s and 6 GB

__all__ = [
    "MAX_CFG_SCALE",
    "check_code_tensor",
    "code_range",
    "check_device",
    "check_dtype",
    "check_finite",
    "check_generate_args",
    "check_generator",
    "check_int",
    "check_real",
    "describe",
    "same_device",
]


def describe(value: Any) -> str:
    """``repr(value)`` cut to 60 characters, for error messages that quote what they were given."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_finite(name: str, tensor: torch.Tensor, fix: str) -> torch.Tensor:
    """Raise unless every element of ``tensor`` is finite (integer and bool tensors always are); returns it.

    ``fix`` completes the message with what the caller should do (e.g. "check the file it was loaded from").
    """
    if not isinstance(tensor, torch.Tensor):
        raise ZonosInputError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if (tensor.is_floating_point() or tensor.is_complex()) and tensor.numel() and not bool(tensor.isfinite().all()):
        bad = int((~tensor.isfinite()).sum())
        raise ZonosInputError(f"{name} contains {bad} NaN or infinite value(s) out of {tensor.numel()}; {fix}")
    return tensor


def check_real(
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    hint: str = "",
) -> float:
    """``value`` as a finite Python float in ``[lo, hi]`` (``(lo, ...`` / ``..., hi)`` with ``lo_open`` /
    ``hi_open``; ``None`` leaves a side unbounded). Refuses bools, strings, ``None`` and non-finite numbers; a
    0-d tensor or numpy scalar is accepted. ``hint`` is appended to the message (e.g. what the value does)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dim() == 0 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ZonosInputError(
            f"{name} must be a real number, got {describe(value)} ({type(value).__name__})"
            + (f"; {hint}" if hint else "")
        )
    try:
        x = float(value)
    except OverflowError:  # an int past float's range (10**400)
        x = math.inf
    if not math.isfinite(x):
        raise ZonosInputError(f"{name} must be a finite number, got {describe(value)}" + (f"; {hint}" if hint else ""))
    too_low = lo is not None and (x <= lo if lo_open else x < lo)
    too_high = hi is not None and (x >= hi if hi_open else x > hi)
    if too_low or too_high:
        left = "-inf" if lo is None else f"{lo:g}"
        right = "inf" if hi is None else f"{hi:g}"
        interval = (
            ("(" if lo_open or lo is None else "[") + f"{left}, {right}" + (")" if hi_open or hi is None else "]")
        )
        raise ZonosInputError(f"{name} must lie in {interval}, got {x:g}" + (f"; {hint}" if hint else ""))
    return x


def check_int(
    name: str,
    value: Any,
    lo: int | None = None,
    hi: int | None = None,
    *,
    allow_integral_float: bool = False,
    hint: str = "",
) -> int:
    """``value`` as a Python int in ``[lo, hi]``. Refuses bools, strings and floats (``2.5``, NaN); with
    ``allow_integral_float`` a float holding a whole number (``50.0``, as JSON may give) is accepted."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not (value.is_floating_point() or value.is_complex()):
        value = value.item()
    suffix = f"; {hint}" if hint else ""
    if isinstance(value, bool):
        raise ZonosInputError(f"{name} must be an integer, got the bool {value}{suffix}")
    if isinstance(value, numbers.Integral):
        n = int(value)
    elif allow_integral_float and isinstance(value, numbers.Real) and math.isfinite(value) and value == int(value):
        n = int(value)
    else:
        raise ZonosInputError(f"{name} must be an integer, got {describe(value)} ({type(value).__name__}){suffix}")
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        left = "-inf" if lo is None else str(lo)
        right = "inf" if hi is None else str(hi)
        raise ZonosInputError(f"{name} must be an integer in [{left}, {right}], got {n}{suffix}")
    return n


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether two devices are the same, taking a CUDA device without an index as the current one."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        current = torch.cuda.current_device() if a.type == "cuda" and torch.cuda.is_available() else 0
        return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
    return a.index == b.index


def check_device(name: str, device: Any) -> torch.device:
    """``device`` as a ``torch.device`` this machine can run; refuses unknown strings and absent backends
    (``"cuda"`` without a GPU, ``"mps"`` off Apple silicon) with the devices that are available."""
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise ZonosInputError(f"{name} must be a device such as 'cpu' or 'cuda', got {describe(device)}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ZonosInputError(f"{name} {device!r} is not a device name; use 'cpu' or 'cuda' ({e})") from None
    available = ["cpu"]
    if torch.cuda.is_available():
        available += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        available.append("mps")
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ZonosInputError(f"{name} {str(dev)!r} is not available on this machine; available: {available}")
    if dev.type == "mps" and "mps" not in available:
        raise ZonosInputError(f"{name} 'mps' is not available on this machine; available: {available}")
    if dev.type not in ("cpu", "cuda", "mps", "meta"):
        raise ZonosInputError(f"{name} {str(dev)!r} is not supported; available: {available}")
    return dev


_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_dtype(name: str, dtype: Any) -> torch.dtype:
    """``dtype`` as a floating ``torch.dtype`` the model's weights can take (float32, bfloat16, float16, float64)."""
    if not isinstance(dtype, torch.dtype) or dtype not in _FLOAT_DTYPES:
        raise ZonosInputError(
            f"{name} must be a floating torch dtype ({', '.join(map(str, _FLOAT_DTYPES))}), got {describe(dtype)}; "
            "e.g. torch.bfloat16 on a GPU, torch.float32 on the CPU"
        )
    return dtype


def check_generator(generator: Any, device: torch.device | str) -> None:
    """``generator`` must be ``None`` or a ``torch.Generator`` on ``device`` or the CPU (the sequences' noise
    seeds are drawn from it on its own device, so either works: the server seeds a CPU generator per request)."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise ZonosInputError(
            f"generator must be a torch.Generator (or None), got {type(generator).__name__}; "
            f"e.g. torch.Generator(device='{torch.device(device).type}').manual_seed(0)"
        )
    if generator.device.type != "cpu" and not same_device(generator.device, device):
        raise ZonosInputError(
            f"generator is on {generator.device} but the model is on {device}; create it there or on the CPU: "
            f"torch.Generator(device='{device}').manual_seed(seed)"
        )


def code_range(codes: torch.Tensor) -> tuple[int, int]:
    """The smallest and largest value of an integer tensor of any dtype (torch has no min/max kernels for uint16,
    uint32 and uint64: those are compared as int64, where a uint64 past 2**63 turns negative and so is refused)."""
    if codes.dtype in (torch.uint16, torch.uint32, torch.uint64):
        codes = codes.to(torch.int64)
    lo, hi = torch.aminmax(codes)
    return int(lo), int(hi)


def check_code_tensor(name: str, codes: Any, n_codebooks: int, codebook_size: int, batch: tuple[int, ...]) -> None:
    """Audio codes: an integer tensor ``(b, n_codebooks, frames)`` with ``b`` in ``batch`` and values in
    ``0 .. codebook_size - 1``. Any integer dtype is accepted (uint8 included: the range is compared as Python
    ints, so it cannot wrap around in the tensor's dtype)."""
    shape_hint = f"({' or '.join(map(str, batch))}, {n_codebooks}, frames) codes from autoencoder.encode"
    if not isinstance(codes, torch.Tensor):
        raise ZonosInputError(f"{name} must be a tensor {shape_hint}, got {type(codes).__name__}")
    if codes.ndim != 3 or codes.shape[1] != n_codebooks or codes.shape[0] not in batch:
        raise ZonosInputError(f"{name} must be {shape_hint}, got shape {tuple(codes.shape)}")
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise ZonosInputError(f"{name} must be an integer tensor (e.g. int64), got {codes.dtype}")
    if codes.numel():
        lo, hi = code_range(codes)
        if lo < 0 or hi >= codebook_size:
            raise ZonosInputError(
                f"{name} must hold codes in 0..{codebook_size - 1}, got values in {lo}..{hi}; replace special "
                f"codes first, e.g. codes.masked_fill(codes >= {codebook_size}, 0)"
            )


def check_generate_args(
    prefix: Any,
    audio_prefix_codes: Any,
    max_new_tokens: Any,
    cfg_scale: Any,
    batch_size: Any,
    generator: Any,
    *,
    device: torch.device | str,
    d_model: int,
    n_codebooks: int = 9,
    codebook_size: int = 1024,
) -> tuple[int, float, int]:
    """Check the arguments of ``Zonos.generate`` before any work; returns ``(max_new_tokens, cfg_scale,
    batch_size)`` as Python ``int``, ``float``, ``int``.

    - ``batch_size`` and ``max_new_tokens``: positive integers (bools and floats refused);
    - ``cfg_scale``: a real number within ±``MAX_CFG_SCALE`` (bools, strings and ``None`` refused);
    - ``prefix``: a floating ``(rows, length ≥ 1, d_model)`` tensor on ``device``, finite, whose rows fit the
      guidance and batch (cond ‖ uncond pair shared by the batch, or one cond and one uncond row per item);
    - ``audio_prefix_codes``: ``None`` or integer codes ``(1 or batch_size, n_codebooks, frames)`` in
      ``0 .. codebook_size - 1`` (any integer dtype);
    - ``generator``: ``None`` or a ``torch.Generator`` on ``device`` or the CPU.
    """
    batch_size = check_int("batch_size", batch_size, 1, MAX_BATCH, hint="the number of clips to generate, e.g. 1")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1, hint="frames to generate (86 ≈ one second)")
    cfg_scale = check_real(
        "cfg_scale",
        cfg_scale,
        -MAX_CFG_SCALE,
        MAX_CFG_SCALE,
        hint="classifier-free guidance, e.g. 2.0 (1.0 turns it off)",
    )
    if not isinstance(prefix, torch.Tensor) or prefix.ndim != 3 or prefix.shape[-1] != d_model:
        got = f"shape {tuple(prefix.shape)}" if isinstance(prefix, torch.Tensor) else type(prefix).__name__
        raise ZonosInputError(
            f"prefix_conditioning must be a (batch, length, {d_model}) tensor from prepare_conditioning, got {got}"
        )
    if not prefix.is_floating_point():
        raise ZonosInputError(f"prefix_conditioning must be a floating-point tensor, got {prefix.dtype}")
    if prefix.shape[1] == 0:
        raise ZonosInputError(
            "prefix_conditioning has length 0; build it with prepare_conditioning(make_cond_dict(...))"
        )
    if not same_device(prefix.device, device):
        raise ZonosInputError(
            f"prefix_conditioning is on {prefix.device} but the model is on {device}: move it with .to()"
        )
    rows = {2, 2 * batch_size} | ({1, batch_size} if cfg_scale == 1.0 else set())
    if prefix.shape[0] not in rows:
        allowed = "2 (shared by the batch)"
        if batch_size > 1:
            allowed += f" or {2 * batch_size} (cond rows, then uncond rows)"
        if cfg_scale == 1.0:
            alone = "1" if batch_size == 1 else f"1 or {batch_size}"
            allowed += f" or, guidance being off, the cond rows alone ({alone})"
        raise ZonosInputError(
            f"prefix_conditioning has batch {prefix.shape[0]}; with cfg_scale={cfg_scale} and "
            f"batch_size={batch_size} it must be {allowed}. Pass what prepare_conditioning returns (one cond "
            "and one uncond row per make_cond_dict)"
        )
    # One reduction (one wait on a CUDA prefix): amax is NaN or inf when any value is; check_finite then counts them.
    peak = float(prefix.detach().abs().amax()) if prefix.numel() else 0.0  # a prefix built with grad too
    if not math.isfinite(peak):
        check_finite(
            "prefix_conditioning",
            prefix,
            "rebuild it with prepare_conditioning; a NaN here usually comes from a NaN input or NaN weights",
        )
    if peak > MAX_PREFIX_ABS:
        raise ZonosInputError(
            f"prefix_conditioning holds values up to {peak:.3g}, past {MAX_PREFIX_ABS:g}: its logits would overflow "
            "to NaN and every code come out 0; pass what prepare_conditioning returns (its values are O(1))"
        )
    if audio_prefix_codes is not None:
        check_code_tensor("audio_prefix_codes", audio_prefix_codes, n_codebooks, codebook_size, (1, batch_size))
    check_generator(generator, device)
    return max_new_tokens, cfg_scale, batch_size
