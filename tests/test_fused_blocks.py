"""The fused decode GEMVs of a block's entry (zonos_accel/triton/norm_linear.py: residual add + LayerNorm in the
projection's prologue, the gated MLP's activation in fc1's epilogue) against their references,
``zonos.ops.add_layer_norm_linear`` and ``add_layer_norm_glu`` (the reference ops composed), evaluated in float64; and
the plain decode projections on the same GEMV (``zonos_accel.triton.gemv.linear``); and whole generations of tiny
models with every fused block op (``fused_blocks``), which must give the reference codes.

The kernels run compiled on the GPU or, with TRITON_INTERPRET=1, in Triton's interpreter on the CPU, on fresh random
inputs at Zonos-v0.1-hybrid shapes (qkv 3072 × 2048, fc1 2 · 8192 × 2048) and ragged ones; on the GPU the output
memory is poisoned with NaN first.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernel_checks import TARGETS, kernel_device, kernel_dtypes, poison_allocator, rel_error
from zonos import ops
from zonos.ops.backend import REFERENCE, Fused


@pytest.fixture(scope="module", params=TARGETS)
def device(request) -> torch.device:
    return kernel_device(request.param)


def _inputs(rows, d, n, dtype, device, seed, residual=True, norm_bias=True, bias=False, glu=False):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)

    args = dict(
        hidden=randn(*rows, d),
        residual=randn(*rows, d) if residual else None,
        norm_weight=1 + randn(d, scale=0.1),
        norm_bias=randn(d, scale=0.1) if norm_bias else None,
        eps=1e-5,
        weight=randn(2 * n if glu else n, d, scale=d**-0.5),
    )
    if not glu:
        args["bias"] = randn(n, scale=0.1) if bias else None
    return args


def _check(device, dtype, rows, d, n, glu=False, seed=0, **flags):
    from zonos_accel.triton import norm_linear

    fast = norm_linear.add_layer_norm_glu if glu else norm_linear.add_layer_norm_linear
    reference = ops.add_layer_norm_glu if glu else ops.add_layer_norm_linear
    args = _inputs(rows, d, n, dtype, device, seed, glu=glu, **flags)
    as64 = {key: v.double() if torch.is_tensor(v) else v for key, v in args.items()}
    ref, ref_residual = reference(**as64)
    ref_same, _ = reference(**args)
    poison_allocator(device)
    out, residual = fast(**args)
    assert out.shape == (*rows, n) and out.dtype == dtype and residual.shape == (*rows, d)
    if args["residual"] is None:
        assert residual is args["hidden"]
    floor = 1e-6
    assert rel_error(out, ref) <= 2 * rel_error(ref_same, ref) + floor
    assert rel_error(residual, ref_residual) <= (floor if dtype == torch.float32 else 2e-3)
    if dtype == torch.float32:  # the op-by-op path's roundings, sums in other orders
        torch.testing.assert_close(out, ref_same, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("glu,n", [(False, 3072), (True, 8192)])
def test_real_shapes(device, glu, n):
    # The interpreter takes tens of seconds per dtype at fc1's size: fp32 there, both dtypes on the GPU.
    for dtype in kernel_dtypes(device)[: 2 if device.type == "cuda" else 1]:
        _check(device, dtype, (2, 1), 2048, n, glu=glu, seed=1)


@pytest.mark.parametrize(
    "rows,d,n,flags",
    [
        ((3,), 48, 40, {}),  # widths not powers of two; a tile of the outputs half full
        ((2, 1), 64, 24, {"bias": True}),  # the decode layout (b, 1, d), a projection bias
        ((1,), 40, 7, {"residual": False, "norm_bias": False}),  # a first block: no residual yet; no norm bias
        ((16,), 32, 64, {}),  # the most rows the kernel takes
    ],
)
@pytest.mark.parametrize("glu", [False, True])
def test_ragged_shapes(device, rows, d, n, flags, glu):
    if glu and flags.get("bias"):
        flags = {**flags, "bias": False}  # fc1 has no bias
    for dtype in kernel_dtypes(device):
        _check(device, dtype, rows, d, n, glu=glu, seed=7 * rows[0] + n, **flags)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 16])
def test_real_shape_rows(device, rows):
    if device.type != "cuda":
        pytest.skip("the interpreter covers 2 rows")
    _check(device, torch.bfloat16, (rows,), 2048, 3072, seed=100 + rows)
    _check(device, torch.bfloat16, (rows,), 2048, 8192, glu=True, seed=200 + rows)


@pytest.mark.parametrize("rows,k,n,bias", [((2, 1), 2048, 2048, False), ((3,), 40, 24, True), ((16,), 64, 9, False)])
def test_plain_linear(device, rows, k, n, bias):
    """Decode-shaped calls on the GEMV equal F.linear (float64 reference); others run F.linear itself."""
    from zonos_accel.triton import gemv

    gen = torch.Generator().manual_seed(k + n)
    for dtype in kernel_dtypes(device):
        x = torch.randn(*rows, k, generator=gen).to(device, dtype)
        w = (torch.randn(n, k, generator=gen) * k**-0.5).to(device, dtype)
        b = torch.randn(n, generator=gen).to(device, dtype) if bias else None
        ref = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
        same = torch.nn.functional.linear(x, w, b)
        poison_allocator(device)
        out = gemv.linear(x, w, b)
        assert out.shape == (*rows, n) and out.dtype == dtype
        assert rel_error(out, ref) <= 2 * rel_error(same, ref) + 1e-6
    many = torch.randn(gemv.MAX_ROWS + 1, 8, device=device)
    assert torch.equal(gemv.linear(many, many[:4]), torch.nn.functional.linear(many, many[:4]))
    with pytest.raises(ValueError, match="does not match weight"):
        gemv.linear(many[:2], torch.randn(4, 9, device=device))


@pytest.mark.parametrize("glu", [False, True])
def test_rows_do_not_depend_on_each_other(device, glu):
    """Each row is normalized and reduced on its own, in an order that does not depend on the other rows or their
    count: a row of a batch equals the same row alone, bit for bit (the engine's batched = solo on the GPU)."""
    from zonos_accel.triton import norm_linear

    fast = norm_linear.add_layer_norm_glu if glu else norm_linear.add_layer_norm_linear
    args = _inputs((5,), 256, 96, torch.float32, device, seed=11, glu=glu)
    batched, batched_residual = fast(**args)
    alone = {key: v[2:3] if key in ("hidden", "residual") else v for key, v in args.items()}
    out, residual = fast(**alone)
    assert torch.equal(batched[2:3], out) and torch.equal(batched_residual[2:3], residual)


def test_fits_and_refusals(device):
    from zonos_accel.triton import gemv, norm_linear

    args = _inputs((2,), 32, 16, torch.float32, device, seed=3)
    assert norm_linear.fits(**args)
    many = _inputs((gemv.MAX_ROWS + 1,), 32, 16, torch.float32, device, seed=3)
    assert not norm_linear.fits(**many)
    with pytest.raises(ValueError, match=f"at most {gemv.MAX_ROWS} rows"):
        norm_linear.add_layer_norm_linear(**many)
    with pytest.raises(ValueError, match="do not match"):
        norm_linear.add_layer_norm_linear(**{**args, "weight": args["weight"][:, :-1]})
    glu = _inputs((2,), 32, 16, torch.float32, device, seed=3, glu=True)
    with pytest.raises(ValueError, match="value and gate"):
        norm_linear.add_layer_norm_glu(**{**glu, "weight": glu["weight"][:-1]})


def _tiny(kind: str, device: str):
    from tests.tiny import random_state_dict, tiny_config
    from zonos.config import ZonosConfig
    from zonos.model import Zonos

    torch.manual_seed(0)
    model = Zonos(ZonosConfig.from_dict(tiny_config(kind)), max_seqlen=256)
    model.load_checkpoint(random_state_dict(model, 0), device=device, dtype=torch.float32)
    model.eval()
    return model


@pytest.mark.parametrize("kind", ["hybrid", "transformer"])
def test_generate_with_fused_blocks_gives_the_reference_codes(device, kind):
    """A tiny model in fp32 generating with every fused block op (their kernels, the reference ops elsewhere) gives
    the reference backend's codes, and each fused kernel ran."""
    if device.type == "cuda":
        pytest.skip("the GPU test below runs the whole accelerated path")
    from zonos_accel.triton import FUSED_BLOCK_OPS, fast_entry

    calls = set()

    def traced(name):
        entry = fast_entry(name)
        fast = entry.fast if isinstance(entry, Fused) else entry

        def op(*args, **kwargs):
            calls.add(name)
            return fast(*args, **kwargs)

        return Fused(op, entry.fits) if isinstance(entry, Fused) else op  # linear serves every call itself

    fused = REFERENCE.replace("fused", **{name: traced(name) for name in FUSED_BLOCK_OPS})
    model = _tiny(kind, "cpu")
    prefix = torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(3))
    codes = {}
    for name, backend in (("reference", REFERENCE), ("fused", fused)):
        model.set_backend(backend)
        codes[name] = model.generate(
            prefix, max_new_tokens=12, progress_bar=False, generator=torch.Generator().manual_seed(5)
        )
    expected = set(FUSED_BLOCK_OPS) - ({"mamba_block_step"} if kind == "transformer" else set())
    assert calls == expected
    assert torch.equal(codes["fused"], codes["reference"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["hybrid", "transformer"])
def test_fused_blocks_give_the_unfused_codes_in_fp32(monkeypatch, kind):
    """A tiny model in fp32 on the GPU, CUDA graphs on: generate with ``fused_blocks`` gives the codes of the
    op-by-op Triton step (no TF32, so the projections round alike), and the fused GEMV ran."""
    from zonos_accel.triton import gemv

    calls = []
    kernel = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    model = _tiny(kind, "cuda")
    prefix = torch.randn(2, 30, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        codes = {}
        for fused in (False, True):
            model.use_accelerators(fused_blocks=fused)
            gen = torch.Generator("cuda").manual_seed(5)
            codes[fused] = model.generate(prefix, max_new_tokens=40, progress_bar=False, generator=gen)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert calls  # the fused kernels ran (in the graphs' captures)
    assert torch.equal(codes[True], codes[False])


def test_batched_requests_equal_their_solo_runs_in_float64_with_fused_blocks(device, tmp_path):
    """The engine with every fused block op, a float64 tiny model: requests decoded side by side (joining at
    different steps, so they run in different buckets) give exactly the codes they give alone."""
    if device.type == "cuda":
        pytest.skip("the GPU's fused-block generations are compared with the op-by-op path above")
    from tests.test_model import _prefix
    from tests.tiny import tiny_model
    from zonos_accel.triton import FUSED_BLOCK_OPS, fast_entry

    model = tiny_model(tmp_path, dtype=torch.float64, max_seqlen=96)
    model.start_engine(slots=4)
    model.set_backend(REFERENCE.replace("fused", **{name: fast_entry(name) for name in FUSED_BLOCK_OPS}))
    prefixes = [_prefix(model, text) for text in ("Hello there.", "A second sentence.", "Three!")]
    settings = [dict(max_new_tokens=14), dict(max_new_tokens=10, cfg_scale=1.0), dict(max_new_tokens=12)]

    def kwargs(i, **extra):
        return dict(settings[i], progress_bar=False, generator=torch.Generator().manual_seed(7 + i), **extra)

    solo = [model.generate(p, **kwargs(i)) for i, p in enumerate(prefixes)]
    handles = {}

    def join_next(i):
        def callback(frame, step, max_steps):
            if step == 2 and i + 1 < len(prefixes) and i + 1 not in handles:
                handles[i + 1] = model.submit(prefixes[i + 1], **kwargs(i + 1, callback=join_next(i + 1)))
            return True

        return callback

    handles[0] = model.submit(prefixes[0], **kwargs(0, callback=join_next(0)))
    for i in range(len(prefixes)):
        assert torch.equal(handles[i].result(), solo[i]), i
