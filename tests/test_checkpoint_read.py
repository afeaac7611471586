"""zonos.checkpoint.read_safetensors: the whole-file reader behind CUDA loads gives what safetensors gives, for every
dtype, a tensor at an odd offset, empty tensors and pieces that end mid-tensor; a malformed or truncated file is a
ValueError naming the problem (load_safetensors turns it into a CheckpointError)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from zonos import checkpoint
from zonos.checkpoint import read_safetensors


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(33, 17, generator=g).bfloat16(),
        "f": torch.randn(5, 3, 2, generator=g),
        "h": torch.randn(7, generator=g).half(),
        "d": torch.randn(4, generator=g, dtype=torch.float64),
        "i": torch.randint(-(2**40), 2**40, (9,), generator=g),
        "b": torch.rand(11, generator=g) > 0.5,
        "u": torch.randint(0, 255, (13,), generator=g, dtype=torch.uint8),
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(3.5),
    }


def _raw_file(path, entries: dict[str, tuple[str, list[int], bytes]], pad: bytes = b"") -> None:
    """A safetensors file laid out exactly as given (tensors back to back in order, no alignment)."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data + pad)


def _same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k].cpu(), v), k


@pytest.mark.parametrize("piece", [checkpoint.STAGING_BYTES, 64, 7])
def test_reads_what_safetensors_reads(tmp_path, monkeypatch, piece):
    monkeypatch.setattr(checkpoint, "STAGING_BYTES", piece)  # small pieces: reads that end mid-tensor, a ragged end
    path = tmp_path / "m.safetensors"
    save_file(_state(), str(path), metadata={"format": "pt"})
    _same(read_safetensors(path, "cpu"), load_file(str(path)))


def test_a_tensor_at_an_odd_offset_is_copied_to_an_aligned_one(tmp_path):
    odd = torch.arange(3, dtype=torch.uint8)
    w = torch.randn(6, 5).bfloat16()
    f = torch.randn(4)
    path = tmp_path / "odd.safetensors"
    _raw_file(path, {"odd": ("U8", [3], odd.numpy().tobytes()),
                     "w": ("BF16", [6, 5], w.view(torch.int16).numpy().tobytes()),
                     "f": ("F32", [4], f.numpy().tobytes())}, pad=b"\0" * 5)  # fmt: skip
    got = read_safetensors(path, "cpu")
    _same(got, {"odd": odd, "w": w, "f": f})


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda d: d[:5], "shorter than the 8-byte"),
        (lambda d: struct.pack("<Q", 10**9) + d[8:], "a header of 1000000000 bytes"),
        (lambda d: d[:8] + b"{" * (len(d) - 8), "not JSON"),
        (lambda d: d[:-3], "truncated"),
    ],
)
def test_damaged_files_name_the_problem(tmp_path, damage, match):
    path = tmp_path / "m.safetensors"
    save_file(_state(), str(path))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=match):
        read_safetensors(path, "cpu")


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}, "known dtype"),
        ({"dtype": "F32", "shape": [2]}, "two offsets"),
        ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, "non-negative"),
        ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, "8 bytes for a F32 tensor of shape"),
        ({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "truncated"),
        ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, "spans bytes 8..0"),
    ],
)
def test_bad_entries_name_the_tensor(tmp_path, entry, match):
    text = json.dumps({"x": entry}).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 8)
    with pytest.raises(ValueError, match=match):
        read_safetensors(path, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("piece", [checkpoint.STAGING_BYTES, 1000])
def test_cuda_reads_through_the_pinned_pieces(tmp_path, monkeypatch, piece):
    """More pieces than pinned buffers (each buffer reused after its copy) and a last piece shorter than the rest:
    every byte arrives; load_safetensors takes this path for CUDA devices."""
    monkeypatch.setattr(checkpoint, "STAGING_BYTES", piece)
    g = torch.Generator().manual_seed(1)
    state = {**_state(), "big": torch.randn(3001, 7, generator=g).bfloat16()}
    path = tmp_path / "m.safetensors"
    save_file(state, str(path))
    got = checkpoint.load_safetensors(path, "cuda")
    assert all(t.is_cuda for t in got.values())
    _same(got, load_file(str(path)))
