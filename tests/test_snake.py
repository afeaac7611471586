"""Snake behind the op boundary: the reference ``zonos.ops.snake`` is the DAC's formula as it was, ``Snake1d``
dispatches through it, and the Triton kernel equals it, run on the CPU by Triton's interpreter (skipped
without triton).  The kernel on a GPU is in tests/test_gpu_snake.py."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from zonos.codec.dac import Snake1d
from zonos.ops.backend import REFERENCE, use_backend
from zonos.ops.snake import snake as reference


def old_snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Snake1d.forward before the op boundary."""
    inv_alpha = (alpha + 1e-9).reciprocal()
    return x + inv_alpha * torch.sin(alpha * x).pow(2)


def inputs(b: int, c: int, t: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x of a few units (several periods of sin) and alphas in [0.3, 2] as in a trained DAC, one of them 0."""
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(b, c, t, generator=g)).to(dtype)
    alpha = 0.3 + 1.7 * torch.rand(1, c, 1, generator=g)
    alpha[0, 0, 0] = 0.0  # the 1e-9 keeps it finite
    return x, alpha


# -- the reference ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_reference_is_the_old_formula(dtype):
    x, alpha = inputs(2, 5, 11, dtype, seed=0)
    old = old_snake(x, alpha)
    new = reference(x, alpha)
    assert new.dtype == old.dtype == torch.promote_types(dtype, torch.float32)
    assert torch.equal(new, old)
    # out_dtype and out round the same values once.
    assert torch.equal(reference(x, alpha, torch.float16), old.to(torch.float16))
    buf = torch.full((2, 5, 20), float("nan"), dtype=torch.float16)
    assert reference(x, alpha, out=buf[..., 4:15]) is not None
    assert torch.equal(buf[..., 4:15], old.to(torch.float16))
    assert buf[..., :4].isnan().all() and buf[..., 15:].isnan().all()


def test_reference_rejects_conflicting_out_dtype():
    x, alpha = inputs(1, 3, 4, torch.float32, seed=1)
    with pytest.raises(ValueError, match="out_dtype"):
        reference(x, alpha, torch.float16, out=torch.empty(1, 3, 4))


def test_snake1d_dispatches_through_its_backend():
    calls = []

    def fake(x, alpha, *args, **kwargs):
        calls.append((x, alpha))
        return -x

    module = Snake1d(3)
    x = torch.randn(2, 3, 5)
    assert torch.equal(module(x), old_snake(x, module.alpha))
    use_backend(module, REFERENCE.replace("fake", snake=fake))
    assert torch.equal(module(x), -x)
    assert len(calls) == 1 and calls[0][0] is x and calls[0][1] is module.alpha
    assert torch.equal(Snake1d(3).ops.snake(x, module.alpha), old_snake(x, module.alpha))  # others unaffected


def test_registered_as_a_triton_op():
    from zonos_accel.triton import _SOURCES

    assert _SOURCES["snake"] == "zonos_accel.triton.snake"


# -- the Triton kernel, interpreted ----------------------------------------------------------------


@pytest.fixture(scope="module")
def fast():
    """The Triton snake from a fresh copy of its module loaded with TRITON_INTERPRET=1, so that its kernel
    runs on the CPU: ``triton.jit`` reads the variable when it decorates, so a copy imported earlier (the one
    in ``sys.modules``) would stay compiled for a GPU."""
    pytest.importorskip("triton")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        spec = importlib.util.find_spec("zonos_accel.triton.snake")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module.snake


def check(out: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor, out_dtype: torch.dtype | None) -> None:
    """Equal to the reference up to sin's last bit (the interpreter's sin is numpy's) and the final rounding:
    a unit in the last place or so, at the scale of the values (|x| up to ~12)."""
    ref = reference(x, alpha, out_dtype)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert not out.isnan().any()
    eps = torch.finfo(out.dtype).eps
    torch.testing.assert_close(out, ref, rtol=2 * eps, atol=16 * eps)


SHAPES = [(1, 1, 1), (2, 3, 7), (1, 37, 13), (2, 24, 333), (1, 5, 1029)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    "dtype,out_dtype",
    [
        (torch.float32, None),
        (torch.float16, None),  # fp32 out: the promotion
        (torch.float16, torch.float16),  # what the next conv takes under fp16 autocast
        (torch.float32, torch.float16),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_kernel_equals_reference(fast, shape, dtype, out_dtype):
    x, alpha = inputs(*shape, dtype, seed=sum(shape))
    check(fast(x, alpha, out_dtype), x, alpha, out_dtype)


def test_kernel_non_contiguous_input(fast):
    x, alpha = inputs(2, 9, 31, torch.float16, seed=2)
    transposed = x.transpose(1, 2).contiguous().transpose(1, 2)  # strides (C*T, 1, C)
    strided = torch.cat([x, x], dim=-1)[..., ::2]  # time stride 2
    for view in (transposed, strided):
        assert not view.is_contiguous()
        check(fast(view, alpha, torch.float16), view, alpha, torch.float16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_writes_into_out_view(fast, dtype):
    """As a streaming conv stage uses it: into the new-samples part of its [history | new] buffer."""
    x, alpha = inputs(2, 6, 19, torch.float16, seed=3)
    buf = torch.full((2, 6, 4 + 19 + 3), float("nan"), dtype=dtype)
    out = buf[..., 4:23]
    assert fast(x, alpha, out=out) is out
    check(out, x, alpha, dtype)  # every sample written
    assert buf[..., :4].isnan().all() and buf[..., 23:].isnan().all()  # nothing else


def test_kernel_float64_runs_the_reference(fast):
    x, alpha = inputs(1, 4, 9, torch.float64, seed=4)
    assert torch.equal(fast(x, alpha), reference(x, alpha))


def test_kernel_rejects_other_shapes(fast):
    x, alpha = inputs(1, 4, 9, torch.float32, seed=5)
    with pytest.raises(ValueError, match="B, C, T"):
        fast(x[0], alpha)
    with pytest.raises(ValueError, match="does not fit"):
        fast(x, alpha, out=torch.empty(1, 4, 8))
