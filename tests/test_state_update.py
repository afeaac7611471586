"""Our Triton kernel of the decode-time Mamba2 state update (zonos_accel/triton/state_update.py) against its
torch reference, ``zonos.ops.ssd_step``, evaluated in float64.

The kernel runs compiled on the GPU (where there is one) or, with TRITON_INTERPRET=1, in Triton's interpreter on
the CPU. Inputs are fresh random tensors at Zonos-v0.1-hybrid shapes (64 heads × 64 channels × 128 state) and
ragged ones, passed as the strided views the mixer passes; the output memory is poisoned with NaN first.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernel_checks import INTERPRET, TARGETS, kernel_device, kernel_dtypes, poison_allocator, rel_error
from zonos import ops


@pytest.fixture(scope="module", params=TARGETS)
def device(request) -> torch.device:
    return kernel_device(request.param)


def _inputs(b, h, p, n, g, dtype, device, seed, raw_dt=True):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)

    xbc = randn(b, h * p + 2 * g * n + 24)  # x, B and C as views of one projection, as the mixer passes them
    x = xbc[:, : h * p].reshape(b, h, p)
    B = xbc[:, h * p : h * p + g * n].reshape(b, g, n)
    C = xbc[:, h * p + g * n : h * p + 2 * g * n].reshape(b, g, n)
    A = (-8 * torch.rand(h, generator=gen)).to(device)  # fp32, as the mixer derives it
    D = randn(h)
    if raw_dt:  # the mixer's raw projection: softplus(dt + dt_bias) inside the op
        dt = randn(b, h + 5)[:, :h]
        extra = {"dt_bias": randn(h) - 3, "dt_softplus": True}
    else:
        dt = torch.nn.functional.softplus(torch.randn(b, h, generator=gen) - 2).to(device=device, dtype=dtype)
        extra = {}
    state = randn(b, h, p, n)
    return state, x, dt, A, B, C, D, extra


def _check(device, dtype, b, h, p, n, g, seed, raw_dt=True, with_d=True):
    from zonos_accel.triton.state_update import ssd_step

    state, x, dt, A, B, C, D, extra = _inputs(b, h, p, n, g, dtype, device, seed, raw_dt)
    D = D if with_d else None
    d64 = lambda t: None if t is None else t.double()  # noqa: E731
    extra64 = {k: d64(v) if torch.is_tensor(v) else v for k, v in extra.items()}
    state64 = state.double()
    ref = ops.ssd_step(state64, x.double(), dt.double(), A.double(), B.double(), C.double(), d64(D), **extra64)
    # The reference in the kernel's dtype: the error of storing the state in that dtype and of fp32 arithmetic.
    state_same = state.clone()
    ref_same = ops.ssd_step(state_same, x, dt, A, B, C, D, **extra)
    poison_allocator(device)
    y = ssd_step(state, x, dt, A, B, C, D, **extra)
    assert y.shape == x.shape and y.dtype == x.dtype and state.dtype == dtype
    floor = 1e-6
    assert rel_error(y, ref) <= 2 * rel_error(ref_same, ref) + floor
    assert rel_error(state, state64) <= 2 * rel_error(state_same, state64) + floor


def test_real_shape(device):
    for dtype in kernel_dtypes(device):
        _check(device, dtype, 1, 64, 64, 128, 1, seed=1)


@pytest.mark.parametrize(
    "b,h,p,n,g,raw_dt,with_d",
    [
        (3, 8, 16, 16, 2, True, True),
        (2, 6, 20, 24, 3, False, True),
        (1, 4, 7, 33, 1, True, False),
        (5, 2, 1, 5, 2, False, False),
    ],
)
def test_ragged_shapes(device, b, h, p, n, g, raw_dt, with_d):
    for dtype in kernel_dtypes(device):
        _check(device, dtype, b, h, p, n, g, seed=7 * b + h, raw_dt=raw_dt, with_d=with_d)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [2, 4, 16, 512])
def test_real_shape_batches(device, b):
    if device.type != "cuda":
        pytest.skip("the interpreter covers batch 1 (the slots of a large engine batch are the same programs)")
    _check(device, torch.bfloat16, b, 64, 64, 128, 1, seed=100 + b)


def test_nan_in_state_reaches_the_output(device):
    """A NaN in one state element shows in that channel's output and in that element of the stored state, and
    nowhere else."""
    from zonos_accel.triton.state_update import ssd_step

    state, x, dt, A, B, C, D, extra = _inputs(2, 4, 8, 16, 1, torch.float32, device, seed=3)
    state[1, 2, 5, 7] = float("nan")
    y = ssd_step(state, x, dt, A, B, C, D, **extra)
    bad = torch.zeros_like(y, dtype=torch.bool)
    bad[1, 2, 5] = True
    assert torch.isnan(y[bad]).all() and torch.isfinite(y[~bad]).all()
    nan = torch.zeros_like(state, dtype=torch.bool)
    nan[1, 2, 5, 7] = True
    assert torch.isnan(state[nan]).all() and torch.isfinite(state[~nan]).all()


def test_rejects_mismatched_shapes(device):
    from zonos_accel.triton.state_update import ssd_step

    state, x, dt, A, B, C, D, extra = _inputs(2, 4, 8, 16, 1, torch.float32, device, seed=4)
    with pytest.raises(ValueError, match="x"):
        ssd_step(state, x[:, :, :4], dt, A, B, C, D, **extra)
    with pytest.raises(ValueError, match="groups"):
        ssd_step(state, x, dt, A, B.expand(2, 3, 16), C.expand(2, 3, 16), D, **extra)


def test_cpu_tensors_without_the_interpreter_are_a_clear_error():
    pytest.importorskip("triton")
    if INTERPRET:
        pytest.skip("the interpreter runs CPU tensors")
    from zonos_accel.triton.state_update import ssd_step

    state, x, dt, A, B, C, D, extra = _inputs(1, 2, 4, 8, 1, torch.float32, torch.device("cpu"), seed=5)
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        ssd_step(state, x, dt, A, B, C, D, **extra)
