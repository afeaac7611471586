"""The fused Mamba2 decode tail (zonos_accel/triton/mamba_step.py: conv step, SSD step and gated RMSNorm in one
kernel) against its reference, ``zonos.ops.mamba_step_tail`` (the three reference ops composed), evaluated in
float64; and the backend rule that composes the tail of whichever three ops a backend runs.

The kernel runs compiled on the GPU or, with TRITON_INTERPRET=1, in Triton's interpreter on the CPU. Inputs are
fresh random tensors at Zonos-v0.1-hybrid shapes (64 heads × 64 channels × 128 state, conv over 4352 channels)
and ragged ones (several groups, channels that do not fill a program), passed as the strided views of one
projection that the mixer passes; the output memory is poisoned with NaN first.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernel_checks import TARGETS, kernel_device, kernel_dtypes, poison_allocator, rel_error
from zonos import ops
from zonos.ops.backend import REFERENCE


@pytest.fixture(scope="module", params=TARGETS)
def device(request) -> torch.device:
    return kernel_device(request.param)


def _inputs(b, h, p, n, g, k, dtype, device, seed, bias=True):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)

    d_inner = h * p
    conv_dim = d_inner + 2 * g * n
    zxbcdt = randn(b, d_inner + conv_dim + h + 3)  # one projection: z | xBC | dt (and a ragged tail)
    z = zxbcdt[:, :d_inner]
    xbc = zxbcdt[:, d_inner : d_inner + conv_dim]
    dt = zxbcdt[:, d_inner + conv_dim : d_inner + conv_dim + h]
    return dict(
        conv_state=randn(b, conv_dim, k),
        xbc=xbc,
        conv_weight=randn(conv_dim, 1, k, scale=0.5),
        conv_bias=randn(conv_dim, scale=0.1) if bias else None,
        ssm_state=randn(b, h, p, n),
        dt=dt,
        A=(-8 * torch.rand(h, generator=gen)).to(device),  # fp32, as the mixer derives it
        D=randn(h),
        dt_bias=randn(h) - 3,
        z=z,
        norm_weight=1 + randn(d_inner, scale=0.1),
        eps=1e-5,
    )


def _check(device, dtype, b, h, p, n, g, k=4, seed=0, bias=True):
    from zonos_accel.triton.mamba_step import mamba_step_tail

    args = _inputs(b, h, p, n, g, k, dtype, device, seed, bias)
    as64 = {key: v.double() if torch.is_tensor(v) else v for key, v in args.items()}
    ref = ops.mamba_step_tail(**as64)
    # The reference in the kernel's dtype: the error of rounding states and activations to it.
    same = {key: v.clone() if torch.is_tensor(v) else v for key, v in args.items()}
    ref_same = ops.mamba_step_tail(**same)
    poison_allocator(device)
    out = mamba_step_tail(**args)
    assert out.shape == (b, h * p) and out.dtype == dtype
    floor = 1e-6
    assert rel_error(out, ref) <= 2 * rel_error(ref_same, ref) + floor
    for name in ("conv_state", "ssm_state"):
        assert rel_error(args[name], as64[name]) <= 2 * rel_error(same[name], as64[name]) + floor, name
    if dtype == torch.float32:  # same roundings as the op-by-op path, sums in another order
        torch.testing.assert_close(out, ref_same, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(args["conv_state"], same["conv_state"], rtol=0, atol=0)


def test_real_shape(device):
    for dtype in kernel_dtypes(device):
        _check(device, dtype, 1, 64, 64, 128, 1, seed=1)


@pytest.mark.parametrize(
    "b,h,p,n,g,k,bias",
    [
        (3, 8, 16, 16, 2, 4, True),  # two groups, each program's channels full
        (2, 4, 20, 24, 2, 3, False),  # 20 channels: the second program of a head holds 4
        (1, 2, 7, 33, 1, 4, True),  # state size not a power of two
        (2, 3, 40, 8, 1, 4, True),  # 9 programs per group
    ],
)
def test_ragged_shapes(device, b, h, p, n, g, k, bias):
    for dtype in kernel_dtypes(device):
        _check(device, dtype, b, h, p, n, g, k, seed=7 * b + h, bias=bias)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [2, 16, 512])
def test_real_shape_batches(device, b):
    if device.type != "cuda":
        pytest.skip("the interpreter covers batch 1")
    _check(device, torch.bfloat16, b, 64, 64, 128, 1, seed=100 + b)


def test_repeated_calls_are_deterministic(device):
    """The group's sum is added in a fixed order whichever program finishes last: equal inputs give equal bits."""
    from zonos_accel.triton.mamba_step import mamba_step_tail

    args = _inputs(2, 8, 16, 16, 1, 4, torch.float32, device, seed=9)
    outs = []
    for _ in range(3):
        fresh = {key: v.clone() if torch.is_tensor(v) else v for key, v in args.items()}
        outs.append((mamba_step_tail(**fresh), fresh["conv_state"], fresh["ssm_state"]))
    for later in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], later))


def test_kept_tickets_serve_every_call_and_are_left_zero(device):
    """Counters kept between calls (the decode cache's): each call gives what one with new counters gives, and
    leaves them zero for the next."""
    from zonos_accel.triton.mamba_step import mamba_step_tail

    b, g = 3, 2
    args = _inputs(b, 8, 16, 16, g, 4, torch.float32, device, seed=11)
    tickets = torch.zeros(b, g, dtype=torch.int32, device=device)
    for step in range(3):
        kept = {key: v.clone() if torch.is_tensor(v) else v for key, v in args.items()}
        fresh = {key: v.clone() if torch.is_tensor(v) else v for key, v in args.items()}
        out = mamba_step_tail(**kept, tickets=tickets)
        assert torch.equal(out, mamba_step_tail(**fresh)), step
        assert torch.equal(kept["ssm_state"], fresh["ssm_state"]) and torch.equal(tickets, torch.zeros_like(tickets))
        args["ssm_state"], args["conv_state"] = kept["ssm_state"], kept["conv_state"]
    with pytest.raises(ValueError, match="tickets"):
        mamba_step_tail(**args, tickets=tickets.long())
    with pytest.raises(ValueError, match="tickets"):
        mamba_step_tail(**args, tickets=tickets[:, :1])


def test_rejects_mismatched_shapes(device):
    from zonos_accel.triton.mamba_step import mamba_step_tail

    args = _inputs(2, 4, 8, 16, 1, 4, torch.float32, device, seed=4)
    with pytest.raises(ValueError, match="xbc"):
        mamba_step_tail(**{**args, "xbc": args["xbc"][:, :-1]})
    with pytest.raises(ValueError, match="does not hold x"):
        mamba_step_tail(**{**args, "conv_state": args["conv_state"][:, :-3]})


def test_a_backend_composes_the_tail_of_its_own_parts():
    """Replacing a part of the tail (conv step, SSD step or gated norm) composes a new tail that calls it; replacing
    the tail itself keeps the given one; other ops leave the tail as it was."""
    calls = []

    def conv_step(*args):
        calls.append("conv")
        return ops.conv_step(*args)

    backend = REFERENCE.replace("traced", conv_step=conv_step)
    args = _inputs(1, 2, 4, 8, 1, 4, torch.float64, torch.device("cpu"), seed=2)
    expected = ops.mamba_step_tail(**{key: v.clone() if torch.is_tensor(v) else v for key, v in args.items()})
    assert torch.equal(backend.mamba_step_tail(**args), expected) and calls == ["conv"]
    assert backend.replace("linear too", linear=ops.linear).mamba_step_tail is backend.mamba_step_tail
    fused = backend.replace("fused", mamba_step_tail=ops.mamba_step_tail)
    assert fused.mamba_step_tail is ops.mamba_step_tail
    assert REFERENCE.mamba_step_tail is ops.mamba_step_tail


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_decode_step_gives_the_unfused_codes_in_fp32(monkeypatch):
    """A tiny hybrid in fp32 on the GPU, CUDA graphs on: generate with ``fused_mamba_step`` gives the codes of the
    op-by-op Triton step (no TF32, so the projections round alike)."""
    from tests.tiny import random_state_dict, tiny_config
    from zonos.config import ZonosConfig
    from zonos.model import Zonos
    from zonos_accel.triton import mamba_step

    calls = []
    kernel = mamba_step.mamba_step_tail
    monkeypatch.setattr(mamba_step, "mamba_step_tail", lambda *a, **k: calls.append(1) or kernel(*a, **k))

    torch.manual_seed(0)
    model = Zonos(ZonosConfig.from_dict(tiny_config("hybrid")), max_seqlen=256)
    model.load_checkpoint(random_state_dict(model, 0), device="cuda", dtype=torch.float32)
    model.eval()
    prefix = torch.randn(2, 30, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        codes = {}
        for fused in (False, True):
            model.use_accelerators(fused_mamba_step=fused)
            gen = torch.Generator("cuda").manual_seed(5)
            codes[fused] = model.generate(prefix, max_new_tokens=40, progress_bar=False, generator=gen)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert calls  # the fused kernel ran (in the graphs' captures)
    assert torch.equal(codes[True], codes[False])
