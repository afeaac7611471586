"""The DAC layer ops (zonos/ops/vocoder.py) and their Triton kernels (zonos_accel/triton/vocoder.py).

The kernels run compiled on the GPU (where there is one) or, with TRITON_INTERPRET=1, in Triton's interpreter on
the CPU.  Each is compared with a float64 evaluation of the reference: no further from it
than torch's own conv in the same dtype, on fresh random inputs with ragged channel counts and odd lengths.
The property the streaming decoder relies on is checked directly: a window computed from
``[history | new]`` equals the same samples of the one-shot call bit for bit, in every dtype.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from zonos.ops import vocoder as reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(scope="module", params=["interpreter", "cuda"])
def target(request):
    """(kernels module, device).  The interpreter runs the kernels on the CPU when the suite starts with
    TRITON_INTERPRET=1 (set later, the interpreter cannot run their nested jit functions)."""
    if request.param == "cuda" and (INTERPRET or not torch.cuda.is_available()):
        pytest.skip("needs a CUDA device (and TRITON_INTERPRET unset)")
    if request.param == "interpreter" and not INTERPRET:
        pytest.skip("run with TRITON_INTERPRET=1 to interpret the kernels on the CPU")
    if request.param == "interpreter" and tuple(map(int, np.__version__.split(".")[:2])) >= (2, 3):
        pytest.skip("Triton 3.6's interpreter fails with numpy >= 2.3: pip install 'numpy<2.3'")
    pytest.importorskip("triton")
    from zonos_accel.triton import vocoder

    return vocoder, torch.device("cuda" if request.param == "cuda" else "cpu")


def _interpreter_limits(device: torch.device, dtype: torch.dtype, tanh: bool = False) -> None:
    if device.type == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter computes bf16 wrongly (numpy has no bf16)")
    if device.type == "cpu" and tanh:
        pytest.skip("Triton's interpreter has no libdevice (tanh)")


def _poison(device: torch.device) -> None:
    """Fill the CUDA caching allocator's free memory with NaN, so an output sample the kernel never writes
    (its ``torch.empty`` reuses that memory) shows up as NaN."""
    if device.type == "cuda":
        junk = torch.full((64 << 20,), float("nan"), device=device)
        del junk


def _randn(*shape, device, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def _conv_inputs(c_in, c_out, k, t, h, device, dtype, seed, residual=False):
    x = _randn(2, c_in, t, device=device, dtype=dtype, seed=seed)
    hist = _randn(2, c_in, h, device=device, dtype=dtype, seed=seed + 1) if h else None
    w = _randn(c_out, c_in, k, device=device, dtype=torch.float32, seed=seed + 2, scale=(c_in * k) ** -0.5)
    b = _randn(c_out, device=device, dtype=torch.float32, seed=seed + 3, scale=0.1)
    return x, hist, w, b


def _within_torch_error(ours, ref_same_dtype, ref64):
    """Ours is as close to the float64 result as torch's conv in the same dtype is (rounding of the output
    and of the residual sum allowed: two units in the last place of the values)."""
    assert ours.shape == ref64.shape and ours.dtype == ref_same_dtype.dtype
    assert not ours.isnan().any()
    eps = torch.finfo(ours.dtype).eps
    ours_err = (ours.double().cpu() - ref64.cpu()).abs().max().item()
    torch_err = (ref_same_dtype.double().cpu() - ref64.cpu()).abs().max().item()
    scale = ref64.abs().max().item()
    assert ours_err <= 2 * torch_err + 4 * eps * scale, (ours_err, torch_err)


def _as_close_as_torch(ours, op: str, x, w, b, kwargs: dict, dtype: torch.dtype) -> None:
    """``ours`` against the reference op ``op`` on the same arguments, in ``dtype`` and in float64."""
    ref = getattr(reference, op)(x, w, b, **kwargs, dtype=dtype)
    d64 = {key: (v.double() if isinstance(v, torch.Tensor) else v) for key, v in kwargs.items()}
    ref64 = getattr(reference, op)(x.double(), w.double(), b.double(), **d64, dtype=torch.float64)
    _within_torch_error(ours, ref, ref64)


CONVS = [
    # (c_in, c_out, k, dilation, padding, t, history, residual, tanh)
    (37, 19, 7, 3, 9, 41, 0, False, False),  # ragged channels, "same" padding
    (24, 24, 7, 9, 0, 9, 54, False, False),  # a stream window: history, no padding
    (24, 24, 1, 1, 0, 33, 0, True, False),  # kernel 1 with the residual
    (72, 40, 1, 1, 0, 17, 0, False, False),  # the codebooks' projection
    (24, 1, 7, 1, 3, 29, 0, False, True),  # the last conv: one channel, tanh
    # Tap-major in 16 bits (channels a multiple of 32, at most TAP_MAJOR_CHANNELS): TMA boxes, slices of 64 or 32.
    (64, 48, 7, 3, 9, 41, 0, False, False),  # "same" padding from the boxes' zeros, ragged outputs
    (96, 96, 7, 9, 0, 9, 54, False, False),  # a stream window, slices of 32 channels
    (64, 1, 7, 1, 3, 29, 0, False, True),  # the last conv: one channel, tanh
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CONVS, ids=str)
def test_conv_matches_reference(target, case, dtype):
    fast, device = target
    c_in, c_out, k, d, p, t, h, use_res, tanh = case
    _interpreter_limits(device, dtype, tanh)
    x, hist, w, b = _conv_inputs(c_in, c_out, k, t, h, device, dtype, seed=c_in + t)
    if hist is not None:  # a stream window [history | new], as a view into a longer buffer
        x = torch.cat([hist, x, x[..., :3]], -1)[..., : h + t]
    n_out = h + t + 2 * p - (k - 1) * d
    kwargs = dict(dilation=d, padding=p, tanh=tanh)
    if use_res:  # the residual read from a [history | new] pair at an offset, as the streaming unit does
        res_h = _randn(2, c_out, 5, device=device, dtype=dtype, seed=7)
        res_x = _randn(2, c_out, n_out - 2, device=device, dtype=dtype, seed=8)
        kwargs.update(residual=res_x, residual_history=res_h, residual_offset=3)
    _poison(device)
    ours = fast.conv1d(x, w, b, **kwargs, dtype=dtype)
    assert ours.shape == (2, c_out, n_out)
    _as_close_as_torch(ours, "conv1d", x, w, b, kwargs, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_1_conv_on_any_layout(target, dtype):
    """A kernel-1 conv reads a contiguous input as its dense operand in place; a strided one, or one with padding,
    is gathered.  Each is as close to the reference as torch's conv; on the GPU, where the tensor cores add the same
    products in the same order either way, the first two are equal bit for bit."""
    fast, device = target
    _interpreter_limits(device, dtype)
    x, _, w, b = _conv_inputs(48, 40, 1, 37, 0, device, dtype, seed=23)
    strided = x.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, samples not adjacent
    assert strided.stride(-1) != 1
    outs = []
    for inputs, padding in ((x, 0), (strided, 0), (x, 2)):
        _poison(device)
        outs.append(fast.conv1d(inputs, w, b, padding=padding, dtype=dtype))
        _as_close_as_torch(outs[-1], "conv1d", inputs, w, b, dict(padding=padding), dtype)
    if device.type == "cuda":
        assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_conv_then_snake_equals_the_two_ops_bit_for_bit(target, dtype, monkeypatch):
    """A residual unit's conv1 applies snake2 as it stores: the same samples as the Snake kernel run on the conv's
    output, bit for bit (split or not), and the reference's up to rounding."""
    fast, device = target
    _interpreter_limits(device, dtype)
    from zonos_accel.triton.snake import snake as fast_snake

    alpha = (torch.rand(1, 150, 1, generator=torch.Generator().manual_seed(2)) * 2 + 0.1).to(device)
    x, _, w, b = _conv_inputs(150, 150, 7, 23, 0, device, dtype, seed=31)
    for split in (True, False):
        monkeypatch.setattr(fast, "_split", lambda n_groups, tiles, device, split=split: split and n_groups > 1)
        _poison(device)
        fused = fast.conv1d(x, w, b, dilation=3, padding=9, alpha=alpha, dtype=dtype)
        two = fast_snake(fast.conv1d(x, w, b, dilation=3, padding=9, dtype=dtype), alpha, dtype)
        assert not fused.isnan().any() and torch.equal(fused, two)
    ref = reference.conv1d(x, w, b, dilation=3, padding=9, alpha=alpha, dtype=dtype)
    assert torch.allclose(fused.float(), ref.float(), rtol=0.02, atol=0.02)
    with pytest.raises(ValueError, match="alphas"):
        fast.conv1d(x, w, b, alpha=alpha[:, :3])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_output_tiles_and_slices_do_not_change_the_sums(target, dtype, monkeypatch):
    """What lets a call pick its output tile and slice by size (``_blocks``): every tile of ``TILES``,
    ``SHORT_TILES`` and ``WIDE_TILES``, with slices of 32 to 256 reduction elements (to 128 in fp32 and with 64
    channels, where 256 overflows shared memory), gives the same samples, bit for bit, at decoder layer shapes, for
    convs and transposed convs (1, 2 or all 8 phases per program: ``_transposed_blocks``), split or not.  (The
    narrow tiles run the same mma.sync m16n8k16 chain per output, the 64-channel ones wgmma on sm_90, which must
    add the same 16-deep products in the same order; on the GPU only, as the interpreter's matmul may round by
    shape.)"""
    fast, device = target
    if device.type != "cuda":
        pytest.skip("a property of the GPU's tensor-core instructions")
    x, _, w, b = _conv_inputs(768, 768, 7, 100, 0, device, dtype, seed=41)
    xt, _, wt, bt = _conv_inputs(1536, 768, 16, 9, 0, device, dtype, seed=42)
    wt = wt.reshape(1536, 768, 16)
    outs = []
    for tile in dict.fromkeys(fast.TILES + fast.SHORT_TILES + fast.WIDE_TILES):
        for reduce in (32, 64, 128, 256) if dtype.itemsize == 2 and tile[0] <= 32 else (32, 64, 128):
            for split in (True, False):

                def blocks(c_out, c_in, taps, n_out, batch, phases, device, tile=tile, reduce=reduce):
                    return tile[0], max(1, reduce >> (taps - 1).bit_length()), tile[1], 4

                monkeypatch.setattr(fast, "_blocks", blocks)
                monkeypatch.setattr(fast, "_split", lambda n_groups, tiles, device, split=split: split and n_groups > 1)
                _poison(device)
                convs = [
                    fast.conv1d(x, w, b, dilation=3, padding=9, dtype=dtype),
                    fast.conv1d(x, w[:, :, :1], b, residual=x, dtype=dtype),
                ]
                for phases in (1, 2, 8):  # a transposed conv's rows: tile[0] of (channel, phase), phases together

                    def transposed(c_out, c_in, taps, n_q, batch, stride, device, tile=tile, phases=phases):
                        co, ci, q, warps = blocks(c_out, c_in, taps, n_q, batch, 1, device)
                        return max(1, co // phases), phases, ci, q, warps

                    monkeypatch.setattr(fast, "_transposed_blocks", transposed)
                    convs.append(fast.conv_transpose1d(xt, wt, bt, stride=8, start=4, length=64, dtype=dtype))
                outs.append(convs)
    for other in outs[1:]:
        for a, ref in zip(other, outs[0]):
            assert not a.isnan().any() and torch.equal(a, ref)


def test_wide_tiles_only_where_they_fit():
    """``_blocks``' rule for the 64-channel tiles: a plain conv of 64 channels or more takes one, no wider than the
    call, once it makes enough programs; a narrower conv, a conv of a transposed conv's phase rows and a call too
    small to fill the SMs keep the 32-channel tiles.  (The tiles' timings are in docs/BENCHMARKS.md, decisions:
    WIDE_TILES.)"""
    pytest.importorskip("triton")
    from zonos_accel.triton import vocoder as fast

    cpu = torch.device("cpu")  # counted as an H200's 132 SMs
    wide = {tile[0] for tile in fast.WIDE_TILES}
    assert wide == {64} and not wide & {tile[0] for tile in fast.TILES + fast.SHORT_TILES}
    # (c_out, c_in, taps, n_out, phases) -> tile: block 2's k7 conv at 2, 8 and 16-frame pushes and one-shot.
    assert fast._blocks(384, 384, 7, 128, 1, 1, cpu)[::2] == (64, 16)
    assert fast._blocks(384, 384, 7, 512, 1, 1, cpu)[::2] == (64, 32)
    assert fast._blocks(384, 384, 7, 1024, 1, 1, cpu)[::2] == (64, 64)
    assert fast._blocks(384, 384, 7, 16384, 1, 1, cpu)[::2] == (64, 64)
    assert fast._blocks(1536, 1024, 7, 2, 1, 1, cpu)[::2] == (64, 16)  # conv1 at 2 frames: 16 wide, not 64
    assert fast._blocks(768, 768, 7, 16, 1, 1, cpu)[0] < 64  # 12 tiles x 6 groups: too few programs
    assert fast._blocks(768, 1536, 16, 17, 1, 8, cpu)[0] < 64  # a conv of 8 phase rows per batch row
    assert fast._blocks(1, 96, 7, 4096, 1, 1, cpu)[0] < 64  # conv2: one output channel
    for n_out in (1, 5, 16, 100, 1000, 5000):
        co, ci, t, _ = fast._blocks(768, 768, 7, n_out, 1, 1, cpu)
        assert t <= max(16, 1 << (n_out - 1).bit_length()) and ci * 8 in (fast.REDUCE, fast.SHORT_REDUCE)


def test_tap_major_convs_are_the_narrow_k7_layers():
    """``_tap_major``: the DAC convs of kernel > 1 over 96 or 192 channels (blocks 3-4's and the last) run tap-major in
    16 bits, the wider ones (conv1's 1024, blocks 1-2's 768 and 384), kernel-1 convs and float32 calls do not: a rule
    of the layer and dtype alone, so that a layer's streamed and one-shot calls add the same products in the same
    order.  ``_taps_blocks``' slice depends on the channels only, whatever the call's length, and its tile is never
    wider than a row's outputs."""
    pytest.importorskip("triton")
    from zonos_accel.triton import vocoder as fast

    cpu = torch.device("cpu")  # Triton's interpreter: runs TMA loads, counted as an H200
    for c_in, k, dtype, expected in (
        (96, 7, torch.float16, True),
        (192, 7, torch.bfloat16, True),
        (384, 7, torch.float16, False),
        (1024, 7, torch.float16, False),
        (192, 1, torch.float16, False),
        (192, 7, torch.float32, False),
        (100, 7, torch.float16, False),
    ):
        assert fast._tap_major(c_in, k, dtype, cpu) == expected, (c_in, k, dtype)
    for c_in, block_ci in ((96, 32), (192, 64), (768, 64)):
        tiles = {fast._taps_blocks(c_out, c_in, n, 1, cpu) for c_out in (1, 96, 192) for n in (1, 37, 4096, 10**6)}
        assert {t[1] for t in tiles} == {block_ci} and {t[2] for t in tiles} == {16, 32, 64}
    for n_out in (1, 16, 32, 33):  # a slab's rows of few outputs: many programs, none wider than a row
        assert fast._taps_blocks(768, 768, n_out, 256, cpu)[2] == max(16, 1 << (n_out - 1).bit_length())


def test_transposed_convs_compute_their_phases_together():
    """``_transposed_blocks``: a program computes the phases of its channels together (every phase for a stride
    that is a power of two, so its outputs are contiguous rows), in :data:`TRANSPOSED_ROWS` rows, a power of two
    that tensor-core products take, whatever the stride."""
    pytest.importorskip("triton")
    from zonos_accel.triton import vocoder as fast

    cpu = torch.device("cpu")
    for stride, phases in ((8, 8), (4, 4), (2, 2), (1, 1), (5, 1), (6, 2), (12, 4)):
        for n_q in (3, 65, 2049, 65537):
            co, p, ci, q, _ = fast._transposed_blocks(384, 768, 2, n_q, 1, stride, cpu)
            assert p == phases and stride % p == 0
            assert co * p == fast.TRANSPOSED_ROWS and q <= max(16, 1 << (n_q - 1).bit_length())
            assert ci * 2 in (fast.REDUCE, fast.SHORT_REDUCE)


TRANSPOSED = [
    # (c_in, c_out, k, stride, t, history, start, length)
    (40, 24, 16, 8, 5, 0, 4, None),  # nn.ConvTranspose1d(k 16, s 8, p 4): length (t - 1) 8 + 16 - 8
    (19, 13, 8, 4, 7, 1, 6, 17),  # a stream window: one history input, a ragged crop
    (24, 12, 4, 2, 9, 0, 1, 16),
    (20, 10, 10, 5, 6, 0, 2, None),  # an odd stride: one phase per program
    (17, 9, 7, 6, 5, 1, 3, 20),  # two phases per program, taps past the kernel (7 of 2 x 6)
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", TRANSPOSED, ids=str)
def test_transposed_conv_matches_reference(target, case, dtype):
    fast, device = target
    c_in, c_out, k, s, t, h, start, length = case
    _interpreter_limits(device, dtype)
    x, hist, w, b = _conv_inputs(c_in, c_out, k, t, h, device, dtype, seed=c_in + k)
    if hist is not None:
        x = torch.cat([hist, x], -1)
    w = w.reshape(c_in, c_out, k)  # [C_in, C_out, K]
    if length is None:
        length = (h + t - 1) * s + k - 2 * start
    kwargs = dict(stride=s, start=start, length=length)
    _poison(device)
    ours = fast.conv_transpose1d(x, w, b, **kwargs, dtype=dtype)
    assert ours.shape == (2, c_out, length)
    _as_close_as_torch(ours, "conv_transpose1d", x, w, b, kwargs, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("c", [48, 64], ids=["dense", "tap-major"])
def test_windows_equal_the_one_shot_call_bit_for_bit(target, c, dtype):
    """What makes a 16-bit stream exact: conv and transposed conv samples computed over a ``[history | new]``
    window (and a residual read from a ``[pending | new]`` pair) equal the one-shot call's, wherever the window
    lies; for the k7 conv of 64 channels in 16 bits, tap-major."""
    fast, device = target
    _interpreter_limits(device, dtype)
    k, d = 7, 3
    p = 3 * d
    x, _, w, b = _conv_inputs(c, c, k, 70, 0, device, dtype, seed=11)
    full = fast.conv1d(x, w, b, dilation=d, padding=p, dtype=dtype)
    w1 = _randn(c, c, 1, device=device, dtype=torch.float32, seed=12, scale=c**-0.5)
    unit = fast.conv1d(full, w1, b, residual=x, dtype=dtype)
    padded = torch.nn.functional.pad(x, (p, p))
    for lo, hi in [(0, 19), (19, 20), (20, 45), (45, 70 + 2 * p)]:  # pushes of 19, 1, 25 samples, then the flush
        start = max(lo - 6 * d, 0)
        window = fast.conv1d(padded[..., start:hi], w, b, dilation=d, dtype=dtype)
        first = start  # output index of the window's first sample
        assert torch.equal(window, full[..., first : first + window.shape[-1]])
        y = fast.conv1d(
            window, w1, b, residual=padded[..., lo:hi], residual_history=padded[..., start:lo],
            residual_offset=p, dtype=dtype,
        )  # fmt: skip
        assert torch.equal(y, unit[..., first : first + y.shape[-1]])
    # The transposed conv: 1 history input, outputs from the new inputs' first on.
    wt = _randn(c, 24, 16, device=device, dtype=torch.float32, seed=13, scale=(c * 2) ** -0.5)
    up = fast.conv_transpose1d(x, wt, b[:24], stride=8, dtype=dtype)  # uncropped
    for lo, hi in [(1, 2), (2, 9), (9, 40)]:
        part = fast.conv_transpose1d(
            x[..., lo - 1 : hi], wt, b[:24], stride=8, start=8, length=8 * (hi - lo), dtype=dtype
        )
        assert torch.equal(part, up[..., 8 * lo : 8 * hi])


SPLIT_CASES = [
    # (c_in, c_out, k, dilation, t, tanh): several reduction groups, the last one ragged
    (300, 40, 7, 3, 5, False),  # 38 slices of 8 channels (the last one 4): groups of 16, 16, 6
    (1100, 24, 1, 1, 9, True),  # kernel 1: 18 slices of 64 channels, with tanh
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_reduction_equals_one_program_bit_for_bit(target, dtype, monkeypatch):
    """A call with few output tiles sums its reduction groups in parallel programs, merged by the last to
    finish; a long call sums them in one program.  Both give the same samples, bit for bit, with the counts a
    caller's scratch keeps (back to zero after each launch: a second launch is right too) and with new ones."""
    fast, device = target
    _interpreter_limits(device, dtype)
    scratch = reference.Scratch()
    outs = {}
    for split in (True, False):
        monkeypatch.setattr(fast, "_split", lambda n_groups, tiles, device, split=split: split and n_groups > 1)
        for c_in, c_out, k, d, t, tanh in SPLIT_CASES:
            if device.type == "cpu" and tanh:
                tanh = False  # the interpreter has no libdevice
            x, _, w, b = _conv_inputs(c_in, c_out, k, t + (k - 1) * d, 0, device, dtype, seed=c_in)
            res = _randn(2, c_out, t, device=device, dtype=dtype, seed=5)
            kwargs = dict(dilation=d, residual=res, tanh=tanh)
            for kept in (scratch, scratch, None):
                _poison(device)
                y = fast.conv1d(x, w, b, **kwargs, dtype=dtype, scratch=kept)
                outs.setdefault((split, c_in), []).append(y)
            _as_close_as_torch(y, "conv1d", x, w, b, kwargs, dtype)
        # A transposed conv: 600 channels × 2 inputs per output, 19 slices of 32 channels.
        x, _, w, b = _conv_inputs(600, 24, 16, 3, 0, device, dtype, seed=9)
        w = w.reshape(600, 24, 16)
        for kept in (scratch, scratch, None):
            _poison(device)
            y = fast.conv_transpose1d(x, w, b, stride=8, start=4, dtype=dtype, scratch=kept)
            outs.setdefault((split, "t"), []).append(y)
    for key, split_outs in outs.items():
        if key[0]:
            for a, b in zip(split_outs, outs[(False, key[1])]):
                assert not a.isnan().any() and torch.equal(a, b)
    (counts,) = [kept for key, kept in scratch.kept.items() if key[0] == "split counts"]
    assert counts and not any(c.any() for c in counts)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_operands_equal_the_gather_bit_for_bit(target, dtype, monkeypatch):
    """Short calls (streaming pushes) unfold their input and read packed weights; long ones (and kernel-1 convs)
    gather both in the kernel.  The two load the same numbers into the same products: the same samples, bit for
    bit, for convs (padding, dilation, ragged channels, a residual from a [history | new] pair, Snake, split or
    not) and transposed convs (ragged crops of a stream window, split or not)."""
    fast, device = target
    _interpreter_limits(device, dtype)
    x, _, w, b = _conv_inputs(37, 19, 7, 41, 0, device, dtype, seed=51)
    xs, _, ws, bs = _conv_inputs(300, 40, 7, 23, 0, device, dtype, seed=52)
    res_h = _randn(2, 40, 5, device=device, dtype=dtype, seed=53)
    res_x = _randn(2, 40, 9, device=device, dtype=dtype, seed=54)
    alpha = (torch.rand(40, generator=torch.Generator().manual_seed(55)) + 0.5).to(device)
    xt, _, wt, bt = _conv_inputs(40, 24, 16, 6, 0, device, dtype, seed=56)
    xu, _, wu, bu = _conv_inputs(600, 24, 16, 3, 0, device, dtype, seed=57)
    wt, wu = wt.reshape(40, 24, 16), wu.reshape(600, 24, 16)
    calls = [
        lambda: fast.conv1d(x, w, b, dilation=3, padding=9, dtype=dtype),
        lambda: fast.conv1d(xs, ws, bs, dilation=2, dtype=dtype),
        lambda: fast.conv1d(
            xs, ws, bs, dilation=2, residual=res_x, residual_history=res_h, residual_offset=3, dtype=dtype
        ),  # fmt: skip
        lambda: fast.conv1d(xs[:, :, :7], ws[:, :, :1], bs, residual=res_x[..., :7], dtype=dtype),  # gathers
        lambda: fast.conv1d(xs, ws, bs, dilation=2, alpha=alpha, dtype=dtype),
        lambda: fast.conv_transpose1d(xt, wt, bt, stride=8, start=4, length=37, dtype=dtype),
        lambda: fast.conv_transpose1d(xt[:, :, 1:], wt, bt, stride=8, start=11, dtype=dtype),
        lambda: fast.conv_transpose1d(xu, wu, bu, stride=8, start=4, dtype=dtype),
    ]
    unfolds = []
    unfold = fast._unfold
    monkeypatch.setattr(fast, "_unfold", lambda *a: unfolds.append(a) or unfold(*a))
    outs = {}
    for split in (True, False):
        monkeypatch.setattr(fast, "_split", lambda n_groups, tiles, device, split=split: split and n_groups > 1)
        for dense_bytes in (0, fast.DENSE_BYTES):
            monkeypatch.setattr(fast, "DENSE_BYTES", dense_bytes)
            for i, call in enumerate(calls):
                _poison(device)
                outs[split, dense_bytes > 0, i] = call()
    assert len(unfolds) == 2 * (len(calls) - 1)  # every short call unfolded but the kernel-1 one, no long call
    for (split, dense, i), y in outs.items():
        assert not y.isnan().any()
        if dense:
            assert torch.equal(y, outs[split, False, i]), (split, i)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flat_tiles_equal_per_row_tiles_bit_for_bit(target, dtype, monkeypatch):
    """Calls of many rows with few outputs each (a vocoder slab's first layers) tile the rows' samples together
    (``FLAT``): each column gathers its own row's inputs, and every output is the same sum as a row's own tile
    gives, bit for bit on the GPU, with each of ``FLAT_TILES`` (ragged channels and columns, split or not): convs with
    padding and dilation, a residual from a [history | new] pair, Snake, a kernel-1 conv, and transposed convs
    cropped as a stream window crops them.  (The interpreter's matmul may round by shape.)"""
    fast, device = target
    _interpreter_limits(device, dtype)
    g = torch.Generator().manual_seed(71)

    def randn(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)

    x, w, b = randn(6, 72, 9), randn(80, 72, 7, scale=72**-0.5, dt=torch.float32), randn(80, scale=0.1)
    xs, ws = randn(5, 40, 23), randn(64, 40, 7, scale=40**-0.5, dt=torch.float32)
    res_h, res_x = randn(5, 64, 5), randn(5, 64, 11)
    alpha = (torch.rand(80, generator=g) + 0.5).to(device)
    xt, wt, bt = randn(7, 40, 4), randn(40, 24, 16, scale=40**-0.5, dt=torch.float32), randn(24, scale=0.1)
    calls = [
        lambda: fast.conv1d(x, w, b, padding=3, dtype=dtype),
        lambda: fast.conv1d(x, w, b, padding=3, alpha=alpha, dtype=dtype),
        lambda: fast.conv1d(
            xs, ws, None, dilation=2, residual=res_x, residual_history=res_h, residual_offset=5, dtype=dtype
        ),  # fmt: skip
        lambda: fast.conv1d(xs[..., :11], ws[..., :1], None, residual=res_x, dtype=dtype),
        lambda: fast.conv_transpose1d(xt, wt, bt, stride=8, start=4, length=21, dtype=dtype),
        lambda: fast.conv_transpose1d(xt, wt, bt, stride=8, dtype=dtype),
    ]
    flat_calls = []
    flat_blocks = fast._flat_blocks
    monkeypatch.setattr(fast, "_flat_blocks", lambda *a: flat_calls.append(a) or flat_blocks(*a))
    tiles = fast.FLAT_TILES
    outs = {}
    for split in (True, False):
        monkeypatch.setattr(fast, "_split", lambda n_groups, tiles, device, split=split: split and n_groups > 1)
        monkeypatch.setattr(fast, "FLAT_ROWS", 10**9)
        before = len(flat_calls)
        for i, call in enumerate(calls):
            _poison(device)
            outs[split, None, i] = call()
        assert len(flat_calls) == before
        monkeypatch.setattr(fast, "FLAT_ROWS", 4)
        for tile in tiles:
            monkeypatch.setattr(fast, "FLAT_TILES", (tile,))
            for i, call in enumerate(calls):
                _poison(device)
                outs[split, tile, i] = call()
    assert len(flat_calls) == 2 * len(tiles) * len(calls)
    for (split, tile, i), y in outs.items():
        assert not y.isnan().any()
        for ref in (outs[split, None, i], outs[True, None, i]):
            if device.type == "cuda":
                assert torch.equal(y, ref), (split, tile, i)
            else:  # the interpreter's matmul may round by shape: what must hold is each column's row and sample
                eps = torch.finfo(dtype).eps
                assert torch.allclose(y, ref, rtol=2 * eps, atol=max(eps, 1e-5)), (split, tile, i)


def test_packed_weights_follow_in_place_changes(target):
    """The packed copy of a weight is kept between calls and packed again, at the same address (what CUDA graphs
    read), when the weight changes in place."""
    fast, device = target
    x, _, w, b = _conv_inputs(24, 16, 7, 20, 0, device, torch.float32, seed=61)
    wt = _randn(24, 16, 16, device=device, dtype=torch.float32, seed=62)
    before = fast.conv1d(x, w, b, dilation=2), fast.conv_transpose1d(x, wt, b, stride=8)
    packs = {key: entry[0].data_ptr() for key, entry in fast._packs.items() if key[0] in (id(w), id(wt))}
    assert len(packs) == 2
    with torch.no_grad():
        w.mul_(-2.0)
        wt.add_(1.0)
    after = fast.conv1d(x, w, b, dilation=2), fast.conv_transpose1d(x, wt, b, stride=8)
    fresh = fast.conv1d(x, w.clone(), b, dilation=2), fast.conv_transpose1d(x, wt.clone(), b, stride=8)
    for a, f, old in zip(after, fresh, before):
        assert torch.equal(a, f) and not torch.equal(a, old)
    assert packs == {key: entry[0].data_ptr() for key, entry in fast._packs.items() if key in packs}
    del w, wt, before, after, fresh
    assert not packs.keys() & fast._packs.keys()  # the entries went with their weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_sequence_tail_in_place_and_growing(target, dtype):
    fast, device = target
    for h, n, keep in [(54, 8, 54), (54, 80, 54), (27, 8, 35), (1, 3, 1), (6, 0, 6), (62, 0, 54), (60, 0, 54)]:
        hist = _randn(2, 37, h, device=device, dtype=dtype, seed=h + n)
        x = _randn(2, 37, n, device=device, dtype=dtype, seed=h + n + 1)
        expected = torch.cat([hist, x], -1)[..., -keep:].clone()
        if keep == h:  # in place: the kernel overwrites the history it reads
            out = fast.sequence_tail(hist, x, keep, out=hist)
            assert out is hist
        elif n == 0:  # a window's history shifted to its front, within one buffer
            out = fast.sequence_tail(hist, x, keep, out=hist[..., :keep])
        else:
            _poison(device)
            out = fast.sequence_tail(hist, x, keep)
        assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_sequence_tail_makes_stream_windows_bit_for_bit(target, dtype):
    """A stream layer's next window in one call: the kept history shifted to the front of the window's own buffer,
    then Snake's outputs for the new samples (bit for bit those of the one-shot decoder's Snake kernel) or the new
    samples cast; for pushes shorter and longer than the history, and long enough for several blocks of them."""
    fast, device = target
    from zonos_accel.triton.snake import snake as fast_snake

    alpha = (torch.rand(37, generator=torch.Generator().manual_seed(1)) * 2 + 0.1).to(device)
    for kept, n, snake in [(54, 8, True), (54, 54, True), (6, 80, False), (54, 3000, True), (1, 1, True)]:
        x = _randn(2, 37, n, device=device, dtype=torch.float16, seed=kept + n, scale=3.0)
        new = fast_snake(x, alpha, dtype) if snake else x.to(dtype)
        a = alpha if snake else None
        last = _randn(2, 37, kept + n + 5, device=device, dtype=dtype, seed=n)  # a longer earlier window
        _poison(device)
        out = fast.sequence_tail(last, x, kept + n, alpha=a)
        assert torch.equal(out, torch.cat([last[..., -kept:], new], -1))
        # In place: the previous window is the same buffer (a repeated push size); its last samples are kept.
        window = _randn(2, 37, kept + n, device=device, dtype=dtype, seed=n + 1)
        expected = torch.cat([window[..., -kept:], new], -1)
        out = fast.sequence_tail(window, x, kept + n, out=window, alpha=a)
        assert out is window and torch.equal(window, expected)
        # The reference: the same up to Snake's last bit (the interpreter's sine is numpy's).
        ref = reference.sequence_tail(last, x, kept + n, alpha=a)
        assert torch.allclose(ref, torch.cat([last[..., -kept:], new], -1), rtol=2e-3, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_sequence_tail_unfolds_the_next_convs_input(target, dtype, monkeypatch):
    """``sequence_tail(..., unfold=(k, d))`` writes the window and, in the same launch, the unfolded input of the
    conv that reads it next, which takes it over: the same window and conv samples, bit for bit, as without the
    hint; in place and into a new buffer, with Snake and without, pushes shorter and longer than the history, and
    windows of one block of samples and of several.  A conv the hint does not describe, or a call without the
    caller's scratch to hand it over in, unfolds for itself."""
    fast, device = target
    scratch = reference.Scratch()
    alpha = (torch.rand(37, generator=torch.Generator().manual_seed(3)) * 2 + 0.1).to(device)
    w = _randn(19, 37, 7, device=device, dtype=torch.float32, seed=4, scale=(37 * 7) ** -0.5)
    b = _randn(19, device=device, dtype=torch.float32, seed=5, scale=0.1)
    unfolds = []
    unfold = fast._unfold
    monkeypatch.setattr(fast, "_unfold", lambda *a: unfolds.append(a) or unfold(*a))
    cases = [(54, 8, 9, True, True), (18, 300, 3, False, False), (6, 1, 1, True, True), (54, 2100, 9, True, True)]
    for kept, n, d, snake, in_place in cases:
        x = _randn(2, 37, n, device=device, dtype=torch.float16, seed=kept + n, scale=3.0)
        a = alpha if snake else None
        last = _randn(2, 37, kept + n, device=device, dtype=dtype, seed=n)
        original = last.clone()
        plain = fast.sequence_tail(last, x, kept + n, alpha=a)
        expected = fast.conv1d(plain, w, b, dilation=d, dtype=dtype)
        assert len(unfolds) == 1
        _poison(device)
        hinted = fast.sequence_tail(
            last, x, kept + n, out=last if in_place else None, alpha=a, unfold=(7, d), scratch=scratch
        )
        assert (hinted is last) == in_place and torch.equal(hinted, plain)
        assert torch.equal(fast.conv1d(hinted, w, b, dilation=d, dtype=dtype, scratch=scratch), expected)
        assert len(unfolds) == 1  # taken over
        fast.sequence_tail(plain.clone(), x, kept + n, alpha=a, unfold=(7, d), scratch=scratch)
        assert torch.equal(fast.conv1d(hinted, w, b, dilation=d, dtype=dtype, scratch=scratch), expected)  # another's
        assert len(unfolds) == 2
        again = fast.sequence_tail(original, x, kept + n, alpha=a, unfold=(7, d))  # no scratch: nothing kept
        assert torch.equal(again, plain)
        assert torch.equal(fast.conv1d(again, w, b, dilation=d, dtype=dtype, scratch=scratch), expected)
        assert len(unfolds) == 3 and not scratch.kept
        unfolds.clear()
    with pytest.raises(ValueError, match="unfold"):
        fast.sequence_tail(last, x, 3, unfold=(7, 0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_sequence_tail_hands_a_tap_major_conv_its_channels_last_copy(target, dtype):
    """``sequence_tail(..., unfold=(k, d))`` before a tap-major conv writes, in the same launch, a channels-last copy of
    the window (not unfolded rows), which the conv takes over: the same window and conv samples, bit for bit, as
    the conv making its own copy; in place and into a new buffer, pushes shorter and longer than the history.  A
    conv of another window does not take it, nor a conv given another caller's scratch."""
    fast, device = target
    _interpreter_limits(device, dtype)
    scratch, other = reference.Scratch(), reference.Scratch()
    c = 64
    alpha = (torch.rand(c, generator=torch.Generator().manual_seed(3)) * 2 + 0.1).to(device)
    w = _randn(c, c, 7, device=device, dtype=torch.float32, seed=4, scale=(c * 7) ** -0.5)
    b = _randn(c, device=device, dtype=torch.float32, seed=5, scale=0.1)
    for kept, n, d, in_place in ((54, 8, 9, True), (18, 300, 3, False), (6, 1, 1, True), (54, 2100, 9, True)):
        x = _randn(2, c, n, device=device, dtype=torch.float16, seed=kept + n, scale=3.0)
        last = _randn(2, c, kept + n, device=device, dtype=dtype, seed=n)
        plain = fast.sequence_tail(last, x, kept + n, alpha=alpha)
        expected = fast.conv1d(plain, w, b, dilation=d, dtype=dtype)  # makes its own copy
        _poison(device)
        hinted = fast.sequence_tail(
            last, x, kept + n, out=last if in_place else None, alpha=alpha, unfold=(7, d), scratch=scratch
        )
        assert (hinted is last) == in_place and torch.equal(hinted, plain)
        window, _, layout, copy = scratch.kept[fast.HANDOFF]
        assert window is hinted and layout == ("channels-last", dtype)
        assert torch.equal(copy, plain.transpose(1, 2))
        assert torch.equal(fast.conv1d(hinted, w, b, dilation=d, dtype=dtype, scratch=other), expected)
        assert fast.HANDOFF in scratch.kept and not other.kept  # another caller's scratch: not taken
        assert torch.equal(fast.conv1d(hinted, w, b, dilation=d, dtype=dtype, scratch=scratch), expected)
        assert fast.HANDOFF not in scratch.kept  # taken over
        fast.sequence_tail(plain.clone(), x, kept + n, alpha=alpha, unfold=(7, d), scratch=scratch)
        assert torch.equal(fast.conv1d(hinted, w, b, dilation=d, dtype=dtype, scratch=scratch), expected)  # another's
        assert fast.HANDOFF not in scratch.kept  # dropped by the conv of another window


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_tap_major_tiles_do_not_change_the_sums(target, dtype, monkeypatch):
    """What lets a tap-major call pick its tile by length (``_taps_blocks``): 16 or 64 output channels (mma.sync or
    wgmma) by 16, 32 or 64 samples give the same samples, bit for bit, at blocks 3 and 4's shapes and the last
    conv's.  (On the GPU only, as the interpreter's matmul may round by shape.)"""
    fast, device = target
    if device.type != "cuda":
        pytest.skip("a property of the GPU's tensor-core instructions")
    cases = [(192, 192, 9, 300), (96, 96, 3, 257), (96, 1, 1, 129)]
    for c_in, c_out, d, t in cases:
        x, _, w, b = _conv_inputs(c_in, c_out, 7, t, 0, device, dtype, seed=c_in + d)
        alpha = (torch.rand(c_out, generator=torch.Generator().manual_seed(d)) + 0.5).to(device)
        outs = []
        for block_co in (16, 64):
            for block_t in (16, 32, 64):

                def blocks(c_out, c_in, n_out, batch, device, tile=(block_co, block_t)):
                    return tile[0], 64 if c_in % 64 == 0 else 32, tile[1]

                monkeypatch.setattr(fast, "_taps_blocks", blocks)
                _poison(device)
                outs.append(fast.conv1d(x, w, b, dilation=d, padding=3 * d, alpha=alpha[:c_out], dtype=dtype))
        for out in outs:
            assert not out.isnan().any() and torch.equal(out, outs[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_sequence_tail_unfolds_the_next_transposed_convs_input(target, dtype, monkeypatch):
    """``sequence_tail(..., unfold=(kernel, stride, start, length))``: the window and, in the same launch, the
    unfolded input of the transposed conv that reads it next, which takes it over: the same samples bit for bit as
    without the hint, for a steady push's span and a span that skips a crop at the start.  A span whose first
    output reads an input before the window's first (a zero) is unfolded by the transposed conv itself."""
    fast, device = target
    scratch = reference.Scratch()
    alpha = (torch.rand(37, generator=torch.Generator().manual_seed(7)) * 2 + 0.1).to(device)
    unfolds = []
    unfold = fast._unfold
    monkeypatch.setattr(fast, "_unfold", lambda *a: unfolds.append(a) or unfold(*a))
    for k, stride, n, start_at in [(16, 8, 2, 0), (16, 8, 5, 3), (8, 4, 1, 0), (4, 2, 37, 5), (16, 8, 3, -8)]:
        w = _randn(37, 19, k, device=device, dtype=torch.float32, seed=k + n, scale=(37 * k) ** -0.5)
        b = _randn(19, device=device, dtype=torch.float32, seed=n, scale=0.1)
        x = _randn(2, 37, n, device=device, dtype=torch.float16, seed=n + 1, scale=3.0)
        last = _randn(2, 37, 1 + n, device=device, dtype=dtype, seed=n + 2)
        start = stride + start_at if start_at >= 0 else 0  # from the first new input (the history's), or before it
        length = (1 + n) * stride - start
        plain = fast.sequence_tail(last, x, 1 + n, alpha=alpha)
        expected = fast.conv_transpose1d(plain, w, b, stride=stride, start=start, length=length, dtype=dtype)
        assert len(unfolds) == 1
        _poison(device)
        hinted = fast.sequence_tail(
            last, x, 1 + n, out=last, alpha=alpha, unfold=(k, stride, start, length), scratch=scratch
        )
        assert hinted is last and torch.equal(hinted, plain)
        got = fast.conv_transpose1d(
            hinted, w, b, stride=stride, start=start, length=length, dtype=dtype, scratch=scratch
        )
        taken = start_at >= 0
        assert torch.equal(got, expected) and len(unfolds) == 1 + (not taken)  # taken over
        fast.conv_transpose1d(hinted, w, b, stride=stride, start=start, length=length, dtype=dtype, scratch=scratch)
        assert len(unfolds) == 2 + (not taken)  # once only
        unfolds.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_sequence_tail_keeps_raw_inputs_in_the_same_call(target, dtype):
    """``sequence_tail(..., raw=(history2, length2, out2))``: besides the window, the last ``length2`` samples of
    ``[history2 | x]`` with x as given (a residual unit's raw inputs), in place or into a new buffer, with the window
    unfolded or not, with one block of new samples or several; and when the window keeps fewer of x's samples than
    the raw tail (no shared launch), still both.  Every sample equals the reference's."""
    fast, device = target
    alpha = (torch.rand(37, generator=torch.Generator().manual_seed(5)) * 2 + 0.1).to(device)
    cases = [  # (window kept, raw kept, new samples, unfold, in place)
        (54, 27, 8, (7, 9), True),
        (54, 27, 8, None, False),
        (18, 9, 300, (7, 3), False),
        (6, 3, 1, (7, 1), True),
        (54, 27, 2100, (7, 9), True),  # several blocks of x, unfolded
        (54, 27, 3000, None, False),  # several blocks of x
        (0, 5, 4, None, False),  # x's first sample not in the window: two launches
    ]
    for kept, kept_r, n, unfold, in_place in cases:
        x = _randn(2, 37, n, device=device, dtype=torch.float16, seed=kept + n, scale=3.0)
        last = _randn(2, 37, kept + n + 5, device=device, dtype=dtype, seed=n)
        last_r = _randn(2, 37, kept_r + n + 3, device=device, dtype=torch.float16, seed=n + 2)
        length = kept + n if kept else n - 1
        expected_r = torch.cat([last_r, x], -1)[..., -(kept_r + n) :].clone()
        ref_r = torch.full_like(expected_r, float("nan"))
        expected = reference.sequence_tail(last, x, length, alpha=alpha, raw=(last_r, kept_r + n, ref_r))
        assert torch.equal(ref_r, expected_r)
        if in_place:  # a repeated push size: both previous buffers are the ones written
            last, last_r = last[..., -length:].clone(), last_r[..., -(kept_r + n) :].clone()
            out, out_r = last, last_r
        else:
            _poison(device)
            out, out_r = None, torch.full_like(expected_r, float("nan"))
        raw = (last_r, kept_r + n, out_r)
        window = fast.sequence_tail(
            last, x, length, out=out, alpha=alpha, unfold=unfold, raw=raw, scratch=reference.Scratch()
        )
        assert (window is last) == in_place
        assert torch.allclose(window, expected, rtol=2e-3, atol=1e-6)  # Snake's last bit: see above
        assert torch.equal(out_r, expected_r)
    with pytest.raises(ValueError, match="cannot hold"):
        fast.sequence_tail(last, x, length, raw=(last_r, kept_r + n, out_r[..., :-1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_sequence_tail_reads_samples_outside_valid_as_zeros(target, dtype):
    """``valid`` (a vocoder slab's per-row signal ranges): x's samples outside row b's ``[lo, hi)`` are read as
    zeros, in the window (before Snake) and in the raw tail, with the window unfolded or not, in place or not, with
    empty, partial and whole ranges; every sample equals the reference's (the reference masks, then runs)."""
    fast, device = target
    alpha = (torch.rand(37, generator=torch.Generator().manual_seed(7)) * 2 + 0.1).to(device)
    for kept, n, unfold, in_place in [(54, 8, (7, 9), True), (18, 300, None, False), (54, 2100, (7, 9), False)]:
        x = _randn(4, 37, n, device=device, dtype=torch.float16, seed=n, scale=3.0)
        valid = torch.tensor([[0, n], [3, n - 2], [n, n], [0, 1]], dtype=torch.int64, device=device)
        last = _randn(4, 37, kept + n, device=device, dtype=dtype, seed=n + 1)
        last_r = _randn(4, 37, kept // 2 + n, device=device, dtype=torch.float16, seed=n + 2)
        masked = x.clone()
        for b, (lo, hi) in enumerate(valid.tolist()):
            masked[b, :, :lo] = 0
            masked[b, :, hi:] = 0
        expected_r = torch.full_like(last_r, float("nan"))
        expected = reference.sequence_tail(last, masked, kept + n, alpha=alpha, raw=(last_r, kept // 2 + n, expected_r))
        ref_r = torch.full_like(last_r, float("nan"))
        assert torch.equal(reference.sequence_tail(last, x, kept + n, alpha=alpha, valid=valid,
                                                   raw=(last_r, kept // 2 + n, ref_r)), expected)  # fmt: skip
        assert torch.equal(ref_r, expected_r)
        _poison(device)
        out = last.clone() if in_place else None
        out_r = last_r.clone() if in_place else torch.full_like(last_r, float("nan"))
        window = fast.sequence_tail(
            last.clone() if not in_place else out, x, kept + n, out=out, alpha=alpha, unfold=unfold,
            raw=(last_r.clone() if not in_place else out_r, kept // 2 + n, out_r), scratch=reference.Scratch(),
            valid=valid,
        )  # fmt: skip
        assert torch.allclose(window, expected, rtol=2e-3, atol=1e-6)  # Snake's last bit: see above
        assert torch.equal(window[2, :, kept:], torch.zeros_like(window[2, :, kept:]))  # an empty range: zeros
        assert torch.equal(out_r, expected_r)
    with pytest.raises(ValueError, match="valid"):
        fast.sequence_tail(last, x, kept + n, valid=valid[:2])


def test_float64_and_bad_arguments_take_the_reference_or_raise(target):
    fast, device = target
    x, hist, w, b = _conv_inputs(8, 8, 7, 12, 3, device, torch.float64, seed=3)
    assert torch.equal(fast.conv1d(x, w.double(), b.double()), reference.conv1d(x, w.double(), b.double()))
    x32 = x.float()
    with pytest.raises(ValueError, match="does not continue"):
        fast.conv1d(x32, w, b, residual=x32[..., :6], residual_history=hist)  # a float64 history, float32 x
    with pytest.raises(ValueError, match="does not continue"):
        fast.sequence_tail(hist, x32[:, :5], 4)
    with pytest.raises(ValueError, match="alphas"):
        fast.sequence_tail(hist.float(), x32, 4, alpha=torch.ones(3, device=device))
    with pytest.raises(ValueError, match="too few"):
        fast.conv1d(x32[..., :3], w, b, dilation=3)
    with pytest.raises(ValueError, match="residual"):
        fast.conv1d(x32, w, b, residual=x32[..., :2])
    for module in (reference, fast):
        with pytest.raises(ValueError, match="outside"):
            module.conv_transpose1d(x32, w.reshape(8, 8, 7), b, stride=4, start=0, length=1000)
        with pytest.raises(ValueError, match="cannot keep"):
            module.sequence_tail(x32, x32, 100)
    for module in (reference, fast):
        with pytest.raises(ValueError, match="cannot hold"):
            module.sequence_tail(x32, x32, 4, out=x32.new_empty(2, 8, 5))
        with pytest.raises(ValueError, match="cannot hold"):
            module.sequence_tail(x32, x32, 4, out=x32.new_empty(2, 8, 4).half())
        with pytest.raises(ValueError, match="cannot hold"):  # the raw tail's out too
            module.sequence_tail(x32, x32, 4, raw=(x32, 4, x32.new_empty(2, 8, 1)))
    for fn in (reference.conv1d, fast.conv1d):
        with pytest.raises(ValueError, match="residual"):
            fn(x32, w, b, padding=3, residual=x32, residual_offset=2)


def test_stream_equals_one_shot_in_the_interpreter(target, monkeypatch):
    """The streaming stages on the kernels (windows with Snake, convs with snake2, split-K where the tiles are
    few) give the one-shot decode's samples bit for bit, on the tiny test DAC in Triton's interpreter (the GPU
    runs the real-size decoder below)."""
    fast, device = target
    if device.type != "cpu":
        pytest.skip("the real-size test below covers the GPU")
    import types

    import triton.language as tl

    from tests.tiny import TINY_DAC, random_dac_weights
    from zonos.codec import DACAutoencoder, DACConfig, StreamingDACDecoder
    from zonos.ops.backend import REFERENCE, use_backend
    from zonos_accel.triton.snake import snake as fast_snake

    # The interpreter has no libdevice: the final conv's tanh as 2 sigmoid(2 x) - 1.
    monkeypatch.setattr(fast, "libdevice", types.SimpleNamespace(tanh=lambda x: 2 * tl.sigmoid(2 * x) - 1))
    config = DACConfig(**TINY_DAC)
    codec = DACAutoencoder(config, random_dac_weights(config))
    kernels = {name: getattr(fast, name) for name in ("conv1d", "conv_transpose1d", "sequence_tail")}
    use_backend(codec.dac, REFERENCE.replace("interpreted kernels", snake=fast_snake, **kernels))
    codes = torch.randint(0, 1024, (1, 9, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        one_shot = codec.dac.decode(codes)
        dec = StreamingDACDecoder(codec)
        outs = [dec.push(codes[..., a:b]) for a, b in [(0, 4), (4, 5), (5, 12)]] + [dec.flush()]
    assert torch.equal(torch.cat(outs, -1), one_shot)


# -- the whole decoder on the GPU ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_size_codec():
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (and TRITON_INTERPRET unset)")
    from zonos.codec import DACAutoencoder, DACConfig
    from zonos.ops.backend import use_backend
    from zonos_accel.triton import triton_backend

    torch.manual_seed(0)
    codec = DACAutoencoder(DACConfig(), device="cuda")  # real size, random weights
    use_backend(codec.dac, triton_backend(names=("conv1d", "conv_transpose1d", "sequence_tail")))
    return codec


@pytest.mark.gpu
@pytest.mark.parametrize("fp16", [True, False], ids=["fp16", "fp32"])
@pytest.mark.parametrize("schedule", [[1] * 24, [3, 7, 1, 13]], ids=["ones", "odd"])
def test_stream_equals_one_shot_bit_for_bit(real_size_codec, fp16, schedule):
    """With the kernels, a stream's samples are the one-shot decode's, bit for bit, in fp16 as in fp32: every
    layer's sums are the same whatever the push sizes.  Three streams per schedule: the eager pushes, the
    captures and the CUDA-graph replays."""
    from zonos.codec import StreamingDACDecoder
    from zonos.codec.autoencoder import decode_precision

    codec = real_size_codec
    codes = torch.randint(0, 1024, (1, 9, 24), generator=torch.Generator().manual_seed(len(schedule))).cuda()
    with torch.no_grad(), decode_precision(codes.device, fp16):
        one_shot = codec.dac.decode(codes).float()
    dec = StreamingDACDecoder(codec, fp16_autocast=fp16)
    for _ in range(3):
        dec.reset()
        outs, n = [], 0
        for size in schedule:
            outs.append(dec.push(codes[..., n : n + size]))
            n += size
        outs.append(dec.flush())
        audio = torch.cat(outs, -1)
        assert audio.shape == one_shot.shape and not audio.isnan().any()
        assert torch.equal(audio, one_shot), f"{int((audio != one_shot).sum())} samples differ"
    assert dec.graph_replays > 0


# 24 streams, one per row, joining over the first three pushes at every frame of a push, 5 to 28 frames long (ends
# known at the start or not): a slab's rows reach conv1's 128-channel flat tiles (FLAT_TILES).
WIDE_PLANS = {i: (i, i % 3, i % 4, 5 + i, i % 2 == 0) for i in range(24)}


@pytest.mark.gpu
@pytest.mark.parametrize("fp16", [True, False], ids=["fp16", "fp32"])
@pytest.mark.parametrize("plans", ["PLANS", "WIDE_PLANS"])
def test_slab_rows_equal_one_shot_bit_for_bit(real_size_codec, fp16, plans):
    """With the kernels, the streams of a :class:`~zonos.codec.slab.VocoderSlab` (joining at different pushes and
    frames within them, one reusing a drained row, garbage codes wherever no stream's frame is; eager pushes, then
    the CUDA-graph replays of each bucket of rows; 4 rows, and 24 whose first layers tile rows together) give each
    stream's one-shot decode bit for bit."""
    from tests import test_slab
    from tests.test_slab import _run_streams
    from zonos.codec.autoencoder import decode_precision
    from zonos.codec.slab import VocoderSlab

    codec = real_size_codec
    plans = test_slab.PLANS if plans == "PLANS" else WIDE_PLANS
    slab = VocoderSlab(codec, rows=max(p[0] for p in plans.values()) + 1, frames=4, fp16_autocast=fp16)
    for seed in range(2):  # the second run replays the graphs the first captured
        audio, codes = _run_streams(slab, plans, seed=seed)
        for i, a in audio.items():
            with torch.no_grad(), decode_precision(a.device, fp16):
                one_shot = codec.dac.decode(codes[i].cuda()).float()[0]
            assert a.shape == one_shot.shape and not a.isnan().any()
            assert torch.equal(a, one_shot), (seed, i, int((a != one_shot).sum()))
    assert slab.decoder.graph_replays > 0


def test_reference_rejects_bad_arguments():
    """The torch references (what the CPU runs) name the problem; the kernels' own checks are tested above."""
    x = torch.randn(1, 4, 10)
    w = torch.randn(4, 4, 3)
    with pytest.raises(ValueError, match="residual has 2 samples"):
        reference.conv1d(x, w, residual=x[..., :2])
    with pytest.raises(ValueError, match="outside"):
        reference.conv_transpose1d(x, w, stride=2, start=5, length=100)
    with pytest.raises(ValueError, match="cannot keep 11"):
        reference.sequence_tail(x[..., :6], x[..., :4], 11)
    with pytest.raises(ValueError, match="does not continue"):
        reference.sequence_tail(x, x[:, :2], 3)
    with pytest.raises(ValueError, match="4 alphas; got 3"):
        reference.conv1d(x, w, alpha=torch.ones(3))
    with pytest.raises(ValueError, match="4 alphas; got 2"):
        reference.sequence_tail(x, x, 3, alpha=torch.ones(2))
    for bad in [(7, 0), (7,), (7.0, 1), [7, 1], (16, 0, 0, 8), (16, 8, -1, 8), (16, 8, 0)]:
        with pytest.raises(ValueError, match="unfold must be"):
            reference.sequence_tail(x, x, 3, unfold=bad)
    assert torch.equal(reference.sequence_tail(x, x, 12, unfold=(3, 2)), reference.sequence_tail(x, x, 12))
    for out in (x.new_empty(1, 4, 5), x.new_empty(1, 4, 1), x.new_empty(1, 4, 4).double()):
        with pytest.raises(ValueError, match="cannot hold the 4 last samples"):
            reference.sequence_tail(x, x, 4, out=out)  # not even one that broadcasts
        with pytest.raises(ValueError, match="cannot hold the 4 last samples"):
            reference.sequence_tail(x, x, 3, raw=(x, 4, out))
    # Another dtype is converted to the history's (through Snake with alpha).
    assert reference.sequence_tail(x.double(), x, 12).dtype == torch.float64
    y = reference.conv1d(x, w, padding=1, residual=x)  # the residual as in a residual unit
    assert torch.allclose(y, torch.nn.functional.conv1d(x, w, padding=1) + x)


@pytest.mark.parametrize("dim", [8, 5])
@pytest.mark.parametrize("length", [1, 7, 130])
def test_codebook_rows_kernel_matches_reference(target, length, dim):
    """The DAC's stacked codebook rows in one launch: the reference's rows exactly (a lookup), with and without the
    range tracking (codes outside the codebook clamped, the range folded into the bounds), at ragged lengths and
    codebook widths, from non-contiguous codes."""
    from zonos.ops.embedding import codebook_rows as reference_rows
    from zonos_accel.triton.embedding import codebook_rows

    _, device = target
    g = torch.Generator().manual_seed(length * 10 + dim)
    size, q = 37, 9
    tables = torch.randn(q * size, dim, generator=g).to(device)
    wide = torch.randint(-5, size + 5, (2, q, 2 * length), generator=g).to(device)
    for codes, bounds in ((wide[..., ::2], torch.tensor([3, 4])), (wide[..., ::2].clamp(0, size - 1), None)):
        ours_bounds = None if bounds is None else bounds.to(device)
        ref_bounds = None if bounds is None else bounds.to(device)
        _poison(device)
        ours = codebook_rows(codes, tables, size, ours_bounds)
        ref = reference_rows(codes, tables, size, ref_bounds)
        assert ours.shape == (2, q * dim, length) and torch.equal(ours, ref)
        if bounds is not None:
            assert torch.equal(ours_bounds, ref_bounds) and ours_bounds.tolist() != [3, 4]
