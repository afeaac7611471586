"""Our Triton kernel of Mamba2's gated RMSNorm (zonos_accel/triton/gated_norm.py) against its torch reference,
``zonos.ops.gated_rms_norm``, evaluated in float64.

The kernel runs compiled on the GPU (where there is one) or, with TRITON_INTERPRET=1, in Triton's interpreter on
the CPU, on fresh random inputs at Zonos-v0.1-hybrid shapes (d_inner 4096, one group) and ragged ones, x and z
passed as strided views of one projection; the output memory is poisoned with NaN first.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernel_checks import INTERPRET, TARGETS, kernel_device, kernel_dtypes, poison_allocator, rel_error
from zonos import ops


@pytest.fixture(scope="module", params=TARGETS)
def device(request) -> torch.device:
    return kernel_device(request.param)


def _inputs(lead, width, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    zx = torch.randn(*lead, 2 * width + 8, generator=gen).to(device=device, dtype=dtype)
    z, x = zx[..., :width], zx[..., width : 2 * width]  # strided views of one projection, as in the mixer
    w = (1 + 0.5 * torch.randn(width, generator=gen)).to(device=device, dtype=dtype)
    return x, z, w


@pytest.mark.parametrize(
    "lead,width,group",
    [
        ((2, 1), 4096, 4096),
        ((1, 1), 4096, 4096),
        ((2, 121), 4096, 4096),
        ((3,), 4096, 1024),
        ((5, 3), 300, 100),
        ((7,), 37, 37),
    ],
)
def test_equals_reference(device, lead, width, group):
    from zonos_accel.triton.gated_norm import gated_rms_norm

    for dtype in kernel_dtypes(device):
        x, z, w = _inputs(lead, width, dtype, device, seed=width + group)
        ref = ops.gated_rms_norm(x.double(), z.double(), w.double(), 1e-5, group)
        ref_same = ops.gated_rms_norm(x, z, w, 1e-5, group)
        poison_allocator(device)
        out = gated_rms_norm(x, z, w, 1e-5, group)
        assert out.shape == x.shape and out.dtype == dtype
        assert rel_error(out, ref) <= 2 * rel_error(ref_same, ref) + 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [16, 512, 2 * 4096])
def test_many_rows(device, rows):
    if device.type != "cuda":
        pytest.skip("the interpreter covers the small row counts")
    from zonos_accel.triton.gated_norm import gated_rms_norm

    x, z, w = _inputs((rows,), 4096, torch.bfloat16, device, seed=rows)
    ref = ops.gated_rms_norm(x.double(), z.double(), w.double(), 1e-5, 4096)
    poison_allocator(device)
    assert rel_error(gated_rms_norm(x, z, w, 1e-5, 4096), ref) < 4e-3


def test_nan_stays_in_its_group(device):
    from zonos_accel.triton.gated_norm import gated_rms_norm

    x, z, w = _inputs((3,), 64, torch.float32, device, seed=1)
    x[1, 40] = float("nan")
    out = gated_rms_norm(x, z, w, 1e-5, 32)
    bad = torch.zeros_like(out, dtype=torch.bool)
    bad[1, 32:] = True
    assert torch.isnan(out[bad]).all() and torch.isfinite(out[~bad]).all()


def test_rejects_a_group_that_does_not_divide(device):
    from zonos_accel.triton.gated_norm import gated_rms_norm

    x, z, w = _inputs((2,), 96, torch.float32, device, seed=2)
    with pytest.raises(ValueError, match="group_size"):
        gated_rms_norm(x, z, w, 1e-5, 64)


def test_cpu_tensors_without_the_interpreter_are_a_clear_error():
    pytest.importorskip("triton")
    if INTERPRET:
        pytest.skip("the interpreter runs CPU tensors")
    from zonos_accel.triton.gated_norm import gated_rms_norm

    x, z, w = _inputs((2,), 64, torch.float32, torch.device("cpu"), seed=3)
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        gated_rms_norm(x, z, w, 1e-5, 64)
