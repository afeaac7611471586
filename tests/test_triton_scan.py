"""Our Triton SSD prefill scan (zonos_accel/triton/ssd_scan.py: chunk states, state passing, chunk scan) against
the reference chunked scan ``zonos.ops.ssd_scan``, evaluated in float64 (itself equal to the token-by-token
recurrence: tests/test_ssd.py).

The kernels run compiled on the GPU or, with TRITON_INTERPRET=1, in Triton's interpreter on the CPU, on fresh random
inputs at Zonos-v0.1-hybrid shapes (64 heads × 64 channels, state 128, one group) as the mixer's strided views of one
conv output, lengths inside one chunk, across several and ragged, with no, bf16 and fp32 initial states; and ragged
head dims, state sizes and groups. Padding tokens (dt = 0, how a batch of unequal prompts is prefilled) leave each
row's final state bit for bit what its own tokens leave.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernel_checks import TARGETS, kernel_device, kernel_dtypes, poison_allocator, rel_error
from zonos import ops
from zonos.errors import ZonosInputError


@pytest.fixture(scope="module", params=TARGETS)
def device(request) -> torch.device:
    return kernel_device(request.param)


def _inputs(b, l, h, p, g, n, dtype, device, seed, init=None):
    gen = torch.Generator().manual_seed(seed)
    xbc = torch.randn(b, l, h * p + 2 * g * n, generator=gen).to(device, dtype)  # one conv output, as the mixer has
    x = xbc[..., : h * p].unflatten(-1, (h, p))
    B = (0.3 * xbc[..., h * p : h * p + g * n]).unflatten(-1, (g, n))
    C = (0.3 * xbc[..., h * p + g * n :]).unflatten(-1, (g, n))
    dt = torch.nn.functional.softplus(torch.randn(b, l, h, generator=gen) - 2).to(device)
    A = (-8 * torch.rand(h, generator=gen)).to(device)
    D = torch.randn(h, generator=gen).to(device)
    s0 = None if init is None else torch.randn(b, h, p, n, generator=gen).to(device, init)
    return dict(x=x, dt=dt, A=A, B=B, C=C, chunk_size=256, D=D, initial_state=s0)


def _check(device, dtype, *shape, init=None, seed=0):
    from zonos_accel.triton.ssd_scan import ssd_scan

    args = _inputs(*shape, dtype, device, seed, init)
    as64 = {key: v.double() if torch.is_tensor(v) else v for key, v in args.items()}
    ref_y, ref_final = ops.ssd_scan(**as64)
    same_y, same_final = ops.ssd_scan(**args)
    poison_allocator(device)
    y, final = ssd_scan(**args)
    assert y.shape == args["x"].shape and y.dtype == dtype and final.dtype == torch.float32
    floor = 1e-6
    assert rel_error(y, ref_y) <= 2 * rel_error(same_y, ref_y) + floor
    assert rel_error(final, ref_final) <= 2 * rel_error(same_final, ref_final) + floor


@pytest.mark.parametrize("length", [1, 100, 256, 300])
@pytest.mark.parametrize("init", [None, torch.bfloat16, torch.float32])
def test_real_shape(device, length, init):
    if device.type != "cuda" and init is torch.bfloat16:
        init = torch.float16  # numpy has no bf16
    for dtype in kernel_dtypes(device):
        _check(device, dtype, 2, length, 64, 64, 1, 128, init=init, seed=length)


@pytest.mark.gpu
@pytest.mark.parametrize("length", [1024, 4096])
def test_long_prompts(device, length):
    if device.type != "cuda":
        pytest.skip("the interpreter covers up to 300 tokens")
    _check(device, torch.bfloat16, 2, length, 64, 64, 1, 128, init=torch.bfloat16, seed=length)


@pytest.mark.parametrize(
    "b,l,h,p,g,n",
    [
        (1, 7, 3, 20, 3, 24),  # a group per head; head dim and state not powers of two
        (3, 65, 4, 16, 2, 32),  # one token into a second chunk
        (2, 130, 2, 64, 1, 64),  # state 64
    ],
)
def test_ragged_shapes(device, b, l, h, p, g, n):
    for dtype in kernel_dtypes(device):
        _check(device, dtype, b, l, h, p, g, n, init=torch.float32, seed=b * l)


def test_padding_leaves_the_state_of_the_valid_tokens(device):
    """A row whose tokens past its length have dt = 0 ends with the state its valid tokens alone leave, bit for bit:
    padding inside the last valid chunk adds exact zeros, and whole chunks of it pass the state on unchanged."""
    from zonos_accel.triton.ssd_scan import ssd_scan

    args = _inputs(1, 200, 4, 16, 1, 32, torch.float32, device, seed=5, init=torch.float32)
    for valid in (70, 128, 199):
        padded = dict(args, dt=args["dt"].clone())
        padded["dt"][:, valid:] = 0
        short = {key: v[:, :valid] if key in ("x", "dt", "B", "C") else v for key, v in args.items()}
        y_short, final_short = ssd_scan(**short)
        y_padded, final_padded = ssd_scan(**padded)
        assert torch.equal(final_padded, final_short), valid
        assert torch.equal(y_padded[:, :valid], y_short)


def test_float64_runs_the_reference_and_bad_shapes_are_refused(device):
    from zonos_accel.triton.ssd_scan import ssd_scan

    args = _inputs(1, 10, 2, 8, 1, 16, torch.float32, device, seed=1)
    as64 = {key: v.double() if torch.is_tensor(v) else v for key, v in args.items()}
    y, final = ssd_scan(**as64)
    ref_y, ref_final = ops.ssd_scan(**as64)
    assert torch.equal(y, ref_y) and torch.equal(final, ref_final)
    with pytest.raises(ZonosInputError, match="do not agree"):
        ssd_scan(**{**args, "dt": args["dt"][:, :-1]})
    with pytest.raises(ZonosInputError, match="initial_state"):
        ssd_scan(**{**args, "initial_state": torch.zeros(1, 2, 8, 15, device=device)})
    with pytest.raises(ZonosInputError, match="chunk_size"):
        ssd_scan(**{**args, "chunk_size": 0})
