"""The fused Mamba2 block decode step (zonos_accel/triton/mamba_block.py: add + LayerNorm + in_proj + conv step,
state update + gate, gated RMSNorm + out_proj in three kernels) against its reference, ``zonos.ops.mamba_block_step``
(the reference ops composed), evaluated in float64; and the backend rule that composes composite ops of a backend's
parts and serves a fused kernel only where it fits. Whole generations with it: tests/test_fused_blocks.py.

The kernels run compiled on the GPU or, with TRITON_INTERPRET=1, in Triton's interpreter on the CPU. Inputs are fresh
random tensors at Zonos-v0.1-hybrid shapes (d_model 2048, 64 heads × 64 channels × 128 state, conv over 4352
channels) and ragged ones (several groups, widths that do not fill a program, no residual, no biases); on the GPU the
output memory is poisoned with NaN first.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernel_checks import TARGETS, kernel_device, kernel_dtypes, poison_allocator, rel_error
from zonos import ops
from zonos.ops.backend import REFERENCE, Fused

STATES = ("conv_state", "ssm_state")


@pytest.fixture(scope="module", params=TARGETS)
def device(request) -> torch.device:
    return kernel_device(request.param)


def _inputs(b, d, h, p, n, g, k, dtype, device, seed, residual=True, bias=True):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)

    d_inner = h * p
    conv_dim = d_inner + 2 * g * n
    return dict(
        hidden=randn(b, d),
        residual=randn(b, d) if residual else None,
        norm_weight=1 + randn(d, scale=0.1),
        norm_bias=randn(d, scale=0.1) if bias else None,
        norm_eps=1e-5,
        in_weight=randn(d_inner + conv_dim + h, d, scale=d**-0.5),
        conv_state=randn(b, conv_dim, k),
        conv_weight=randn(conv_dim, 1, k, scale=0.5),
        conv_bias=randn(conv_dim, scale=0.1) if bias else None,
        ssm_state=randn(b, h, p, n),
        A=(-8 * torch.rand(h, generator=gen)).to(device),  # fp32, as the mixer derives it
        D=randn(h),
        dt_bias=randn(h) - 3,
        gate_weight=1 + randn(d_inner, scale=0.1),
        gate_eps=1e-5,
        out_weight=randn(d, d_inner, scale=d_inner**-0.5),
    )


def _copy(args, dtype=None):
    return {key: (v.to(dtype) if dtype else v.clone()) if torch.is_tensor(v) else v for key, v in args.items()}


def _check(device, dtype, *shape, seed=0, residual=True, bias=True):
    from zonos_accel.triton.mamba_block import mamba_block_step

    args = _inputs(*shape, dtype, device, seed, residual, bias)
    as64 = _copy(args, torch.float64)
    ref, ref_residual = ops.mamba_block_step(**as64)
    # The reference in the kernels' dtype: the error of rounding states and activations to it.
    same = _copy(args)
    ref_same, _ = ops.mamba_block_step(**same)
    poison_allocator(device)
    out, new_residual = mamba_block_step(**args)
    b, d = shape[:2]
    assert out.shape == (b, d) and out.dtype == dtype and new_residual.shape == (b, d)
    floor = 1e-6
    assert rel_error(out, ref) <= 2 * rel_error(ref_same, ref) + floor
    assert rel_error(new_residual, ref_residual) <= floor if dtype == torch.float32 else 2e-3
    for name in STATES:
        assert rel_error(args[name], as64[name]) <= 2 * rel_error(same[name], as64[name]) + floor, name
    if dtype == torch.float32:  # the op-by-op path's roundings, sums in other orders
        torch.testing.assert_close(out, ref_same, rtol=1e-5, atol=1e-5)
        for name in STATES:
            torch.testing.assert_close(args[name], same[name], rtol=1e-5, atol=1e-5)


def test_real_shape(device):
    # The interpreter takes ~35 s per dtype at this size: fp32 there, both dtypes on the GPU.
    for dtype in kernel_dtypes(device)[: 2 if device.type == "cuda" else 1]:
        _check(device, dtype, 2, 2048, 64, 64, 128, 1, 4, seed=1)


@pytest.mark.parametrize(
    "b,d,h,p,n,g,k,residual,bias",
    [
        (3, 48, 8, 16, 16, 2, 4, True, True),  # two groups, each program's channels full
        (2, 64, 4, 20, 24, 2, 3, True, False),  # 20 channels: the second program of a head holds 4; no biases
        (1, 40, 2, 7, 33, 1, 4, False, True),  # no residual yet (a first block); sizes not powers of two
        (16, 32, 3, 40, 8, 1, 4, True, True),  # the most rows the kernels take; 9 programs per group
    ],
)
def test_ragged_shapes(device, b, d, h, p, n, g, k, residual, bias):
    for dtype in kernel_dtypes(device):
        _check(device, dtype, b, d, h, p, n, g, k, seed=7 * b + h, residual=residual, bias=bias)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 8, 16])
def test_real_shape_rows(device, b):
    if device.type != "cuda":
        pytest.skip("the interpreter covers 2 rows")
    _check(device, torch.bfloat16, b, 2048, 64, 64, 128, 1, 4, seed=100 + b)


def test_repeated_calls_are_deterministic(device):
    """The norm's sums are added in a fixed order: equal inputs give equal bits, outputs and states."""
    from zonos_accel.triton.mamba_block import mamba_block_step

    args = _inputs(2, 32, 8, 16, 16, 1, 4, torch.float32, device, seed=9)
    outs = []
    for _ in range(3):
        fresh = _copy(args)
        outs.append((*mamba_block_step(**fresh), *(fresh[name] for name in STATES)))
    for later in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], later))


def test_rows_do_not_depend_on_each_other(device):
    """A row of a batch gives the output, residual and states it gives alone, bit for bit."""
    from zonos_accel.triton.mamba_block import mamba_block_step

    args = _inputs(4, 32, 8, 16, 16, 1, 4, torch.float32, device, seed=13)
    batched = _copy(args)
    out, residual = mamba_block_step(**batched)
    rows = {key: v[1:2] if key in ("hidden", "residual", *STATES) else v for key, v in _copy(args).items()}
    alone, alone_residual = mamba_block_step(**rows)
    assert torch.equal(out[1:2], alone) and torch.equal(residual[1:2], alone_residual)
    assert all(torch.equal(batched[name][1:2], rows[name]) for name in STATES)


@pytest.mark.parametrize(
    "b,d,h,p,n,g,tile_elements",
    [
        (2, 2048, 64, 64, 128, 1, None),  # real size: 8-channel tiles
        (3, 64, 8, 16, 16, 2, 256),  # two groups, 4-channel tiles: a B or C tile feeds half the heads
        (16, 32, 6, 8, 8, 3, 64),  # the most rows; a dt tile holds 2 of the 6 heads, the last one partly empty
    ],
)
def test_state_update_inside_in_proj(device, monkeypatch, b, d, h, p, n, g, tile_elements):
    """The two-launch step (each in_proj tile counts itself into the heads it feeds; the one that completes a head
    updates its state) equals the three-launch one and the reference, leaves the counters zero for the next call,
    and gives equal bits on a repeated call."""
    from zonos_accel.triton import gemv, mamba_block

    if tile_elements is not None:
        monkeypatch.setattr(gemv, "TILE_ELEMENTS", tile_elements)
    tile = gemv.block_n(d)
    assert p % tile == 0 and n % tile == 0  # the shapes it takes
    dtypes = kernel_dtypes(device)[: 1 if device.type != "cuda" and d > 1024 else 2]
    for dtype in dtypes:
        args = _inputs(b, d, h, p, n, g, 4, dtype, device, seed=b + h)
        as64 = _copy(args, torch.float64)
        ref, _ = ops.mamba_block_step(**as64)
        three = _copy(args)
        out_three, _ = mamba_block.mamba_block_step(**three)
        monkeypatch.setattr(mamba_block, "SSM_IN_PROJ", True)
        counters = torch.zeros(h, dtype=torch.int32, device=device)
        outs = []
        for _ in range(2):
            two = _copy(args)
            outs.append((*mamba_block.mamba_block_step(**two, counters=counters), two["ssm_state"]))
            assert torch.equal(counters, torch.zeros_like(counters))
        monkeypatch.setattr(mamba_block, "SSM_IN_PROJ", False)
        assert all(torch.equal(x, y) for x, y in zip(outs[0], outs[1]))
        out_two, residual_two, state_two = outs[0]
        assert rel_error(out_two, ref) <= 2 * rel_error(out_three, ref) + 1e-6
        if dtype == torch.float32:
            torch.testing.assert_close(out_two, out_three, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(state_two, three["ssm_state"], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="counters"):
        monkeypatch.setattr(mamba_block, "SSM_IN_PROJ", True)
        mamba_block.mamba_block_step(**_copy(args), counters=counters[:-1])


def test_rejects_what_it_cannot_serve(device):
    from zonos_accel.triton.mamba_block import MAX_ROWS, fits, mamba_block_step

    args = _inputs(2, 32, 4, 8, 16, 1, 4, torch.float32, device, seed=4)
    with pytest.raises(ValueError, match="in_weight"):
        mamba_block_step(**{**args, "in_weight": args["in_weight"][:-1]})
    with pytest.raises(ValueError, match="does not hold x"):
        mamba_block_step(**{**args, "conv_state": args["conv_state"][:, :-3]})
    with pytest.raises(ValueError, match="residual"):
        mamba_block_step(**{**args, "residual": args["residual"][:1]})
    assert fits(**args)
    rows = _inputs(MAX_ROWS + 1, 32, 4, 8, 16, 1, 4, torch.float32, device, seed=4)
    assert not fits(**rows)
    with pytest.raises(ValueError, match=f"at most {MAX_ROWS} rows"):
        mamba_block_step(**rows)


def test_a_backend_composes_composites_of_its_own_parts():
    """Replacing a part (conv step, linear, ...) composes the composites anew of it; a composite given as a function
    is kept; a Fused kernel serves the calls it fits, and the rest run the composition of the backend's current
    parts, also after a later replacement."""
    calls = []

    def traced(name):
        reference = REFERENCE.op(name)
        return lambda *a, **k: calls.append(name) or reference(*a, **k)

    args = _inputs(1, 16, 2, 4, 8, 1, 4, torch.float64, torch.device("cpu"), seed=2)
    expected = ops.mamba_block_step(**_copy(args))
    backend = REFERENCE.replace("traced", conv_step=traced("conv_step"))
    assert all(torch.equal(a, b) for a, b in zip(backend.mamba_block_step(**_copy(args)), expected))
    assert calls == ["conv_step"]
    given = backend.replace("given", mamba_step_tail=ops.mamba_step_tail)
    assert given.mamba_step_tail is ops.mamba_step_tail

    calls.clear()
    small = Fused(traced("mamba_block_step"), fits=lambda hidden, *rest, **named: hidden.shape[0] == 1)
    fused = backend.replace("fused", mamba_block_step=small).replace("linear", linear=traced("linear"))
    fused.mamba_block_step(**_copy(args))
    assert calls == ["mamba_block_step"]  # served by the kernel, not composed
    calls.clear()
    two = _inputs(2, 16, 2, 4, 8, 1, 4, torch.float64, torch.device("cpu"), seed=2)
    fused.mamba_block_step(**_copy(two))
    assert calls == ["linear", "conv_step", "linear"]  # the composition of the later parts
    with pytest.raises(ValueError, match="composite"):
        REFERENCE.replace("bad", linear=small)
