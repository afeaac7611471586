"""Checkpoint reading and strict checks shared by every loader (model, codec, speaker embedding)."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

from zonos.errors import CheckpointError

__all__ = [
    "MAX_LISTED",
    "CheckpointMismatchError",
    "check_finite_state_dict",
    "check_state_dict",
    "load_safetensors",
    "read_safetensors",
]

MAX_LISTED = 10  # names shown per kind of problem
# A CUDA load reads the file in pieces of this size into STAGING_BUFFERS pinned buffers, on as many threads, while
# the pieces read before copy to the GPU (docs/BENCHMARKS.md, decisions: STAGING_BYTES, STAGING_BUFFERS).
STAGING_BYTES = 32 << 20
STAGING_BUFFERS = 4
_MAX_HEADER = 100 << 20  # what safetensors itself accepts
_DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


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
        if torch.device(device).type == "cuda":
            return read_safetensors(path, device)
        with safe_open(str(path), framework="pt", device=str(device)) as f:  # mapped: nothing copied until used
            for key in f.keys():
                state[key] = f.get_tensor(key)
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({type(e).__name__}: {e}); it is probably truncated or "
            "corrupted (an interrupted download): delete it and download it again"
        ) from None
    return state


def read_safetensors(path: str | os.PathLike, device: str | torch.device) -> dict[str, Tensor]:
    """Every tensor of a ``.safetensors`` file as views of one buffer on ``device``: the file read once, in large
    pieces on several threads; to a CUDA device through pinned buffers, each piece's copy to the GPU overlapping
    the reads of the next ones: Zonos-v0.1-hybrid's 3.3 GB in 0.30-0.35 s on an H100 host, against 0.87 s for
    safetensors' ``load_file(..., device="cuda")``, tensor by tensor from pageable memory. A malformed or truncated
    file raises ValueError."""
    device = torch.device(device)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ValueError(f"{size} bytes: shorter than the 8-byte header length")
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > min(_MAX_HEADER, size - 8):
            raise ValueError(f"a header of {header_len} bytes in a file of {size}")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"the header is not JSON: {e}") from None
        start = 8 + header_len
        entries = _entries(header, size - start)
        data = torch.empty(max((e for _, _, _, e in entries.values()), default=0), dtype=torch.uint8, device=device)
        _read_into(f.fileno(), start, data)
    state = {}
    for name, (dtype, shape, b, e) in entries.items():
        raw = data[b:e]
        if b % dtype.itemsize:  # safetensors does not align a tensor after an odd-sized one
            raw = raw.clone()
        state[name] = raw.view(dtype).view(shape)
    return state


def _entries(header, data_size: int) -> dict[str, tuple[torch.dtype, list[int], int, int]]:
    """name -> (dtype, shape, first byte, end byte) of each tensor in a safetensors header, checked."""
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    entries = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (b, e) = _DTYPES[entry["dtype"]], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor {name!r}: an entry without a known dtype, a shape and two offsets") from None
        if not all(isinstance(v, int) and v >= 0 for v in (*shape, b, e)):
            raise ValueError(f"tensor {name!r}: shape {shape} and offsets {[b, e]} must be non-negative integers")
        if b > e or e > data_size:
            raise ValueError(f"tensor {name!r} spans bytes {b}..{e} of {data_size}: the file is truncated")
        if e - b != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"tensor {name!r}: {e - b} bytes for a {entry['dtype']} tensor of shape {shape}")
        entries[name] = (dtype, shape, b, e)
    return entries


def _read_exactly(fd: int, offset: int, view: memoryview) -> None:
    while len(view):
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise ValueError("the file ends before its last tensor: it is truncated")
        offset, view = offset + n, view[n:]


def _read_into(fd: int, offset: int, data: Tensor) -> None:
    """Fill ``data`` (uint8) with the file's bytes from ``offset`` on: straight into it on the CPU, else through
    pinned buffers, each piece copied on a side stream once read and its buffer reused once that copy is done."""
    pieces = [(p, min(STAGING_BYTES, data.numel() - p)) for p in range(0, data.numel(), STAGING_BYTES)]
    with ThreadPoolExecutor(STAGING_BUFFERS, thread_name_prefix="zonos-read") as pool:
        if data.device.type == "cpu":
            target = memoryview(data.numpy())
            list(pool.map(lambda p: _read_exactly(fd, offset + p[0], target[p[0] : p[0] + p[1]]), pieces))
            return
        k = min(STAGING_BUFFERS, len(pieces))
        buffers = [torch.empty(pieces[0][1], dtype=torch.uint8, pin_memory=True) for _ in range(k)]
        views = [memoryview(b.numpy()) for b in buffers]
        copied = [None] * k  # the event after the last copy out of each buffer
        stream = torch.cuda.Stream(data.device)

        def read(i: int) -> None:
            if copied[i % k] is not None:
                copied[i % k].synchronize()
            p, n = pieces[i]
            _read_exactly(fd, offset + p, views[i % k][:n])

        reads = {i: pool.submit(read, i) for i in range(k)}
        with torch.cuda.stream(stream):
            for i, (p, n) in enumerate(pieces):
                reads.pop(i).result()
                data[p : p + n].copy_(buffers[i % k][:n], non_blocking=True)
                copied[i % k] = torch.cuda.Event()
                copied[i % k].record(stream)
                if i + k < len(pieces):
                    reads[i + k] = pool.submit(read, i + k)
        stream.synchronize()  # before data is used on any other stream, and before the buffers are freed


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
