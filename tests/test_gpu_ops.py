"""Each Triton fast path equals its torch reference in :mod:`zonos.ops` on the GPU: fresh random inputs at
Zonos-v0.1-hybrid shapes and at ragged ones, compared with the reference evaluated in float64."""

import pytest
import torch

from zonos import ops


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


def _fast(name):
    from zonos_accel.triton import fast_op

    return fast_op(name)


def _rel(out, ref):
    assert torch.isfinite(out).all()
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _tol(dtype):
    return 1e-5 if dtype == torch.float32 else 1e-2


def _randn(*shape, dtype=torch.bfloat16, scale=1.0):
    return (scale * torch.randn(*shape, device="cuda")).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b,c,k", [(2, 4352, 4), (1, 4352, 4), (3, 100, 4), (2, 37, 3)])
@gpu
def test_conv_step(dtype, b, c, k):
    state = _randn(b, c, k, dtype=dtype)
    x = _randn(b, c + 64, dtype=dtype)[:, 5 : 5 + c]  # a strided view, as the mixer passes it
    w, bias = _randn(c, 1, k, dtype=dtype), _randn(c, dtype=dtype)
    ref_state = state.double()
    ref = ops.conv_step(ref_state, x.double(), w.double(), bias.double())
    out = _fast("conv_step")(state, x, w, bias)
    assert out.dtype == dtype and out.shape == (b, c)
    assert _rel(out, ref) < _tol(dtype)
    assert torch.equal(state.double(), ref_state)  # the shifted state holds stored values, no arithmetic


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "b,hq,hkv,d,max_seqlen,position",
    [
        (2, 16, 4, 128, 4096, 0),
        (2, 16, 4, 128, 4096, 130),
        (2, 16, 4, 128, 4096, 2700),
        (1, 16, 4, 128, 4096, 4095),
        (2, 4, 2, 16, 250, 77),
        (1, 3, 3, 40, 300, 299),
    ],
)
@gpu
def test_decode_attention(dtype, b, hq, hkv, d, max_seqlen, position):
    q = _randn(b, 1, hq, d, dtype=dtype)
    k, v = _randn(b, max_seqlen, hkv, d, dtype=dtype), _randn(b, max_seqlen, hkv, d, dtype=dtype)
    pos = torch.tensor(position, device="cuda")
    ref = ops.decode_attention(q.double(), k.double(), v.double(), pos)
    out = _fast("decode_attention")(q, k, v, pos)
    assert out.dtype == dtype and out.shape == q.shape
    assert _rel(out, ref) < _tol(dtype)


@gpu
def test_decode_attention_graph_replays_across_positions():
    """One graph, the position moved between replays: single-split and merged positions alternate, so a split
    counter left non-zero by a merge would make a later merge skip or repeat (the output would be wrong)."""
    b, hq, hkv, d, max_seqlen = 2, 16, 4, 128, 4096
    q = _randn(b, 1, hq, d)
    k, v = _randn(b, max_seqlen, hkv, d), _randn(b, max_seqlen, hkv, d)
    pos = torch.tensor(0, device="cuda")
    fast = _fast("decode_attention")
    fast(q, k, v, pos)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fast(q, k, v, pos)
    for position in (130, 5, 2999, 127, 128, 4095, 1000):
        q.copy_(_randn(b, 1, hq, d))
        pos.fill_(position)
        out.fill_(float("nan"))
        graph.replay()
        ref = ops.decode_attention(q.double(), k.double(), v.double(), pos)
        assert _rel(out, ref) < _tol(torch.bfloat16), position


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "b,hq,hkv,d,max_seqlen,n,position",
    [
        (2, 16, 4, 128, 4096, 121, 0),
        (2, 16, 4, 128, 4096, 9, 112),
        (2, 16, 4, 128, 4096, 256, 512),
        (2, 16, 4, 128, 4096, 1, 4095),
        (1, 16, 4, 128, 4096, 13, 4083),
        (2, 4, 2, 16, 250, 37, 70),
    ],
)
@gpu
def test_prefill_attention(dtype, b, hq, hkv, d, max_seqlen, n, position):
    qkv = _randn(b, n, hq + 2 * hkv, d, dtype=dtype)
    q = qkv[:, :, :hq]  # a strided view of the fused projection (the layout without rotary)
    k, v = _randn(b, max_seqlen, hkv, d, dtype=dtype), _randn(b, max_seqlen, hkv, d, dtype=dtype)
    pos = torch.tensor(position, device="cuda")
    ref = ops.prefill_attention(q.double(), k.double(), v.double(), pos)
    k[:, position + n :], v[:, position + n :] = float("nan"), float("nan")  # rows no query sees: never read
    out = _fast("prefill_attention")(q, k, v, pos)
    assert out.dtype == dtype and out.shape == q.shape
    assert _rel(out, ref) < _tol(dtype)


@pytest.mark.parametrize("b,h,p,n,g", [(2, 64, 64, 128, 1), (1, 64, 64, 128, 1), (3, 8, 16, 16, 2)])
@pytest.mark.parametrize("raw_dt", [False, True])
@gpu
def test_ssd_step(b, h, p, n, g, raw_dt):
    state = _randn(b, h, p, n)
    x = _randn(b, h * p + 32)[:, : h * p].reshape(b, h, p)
    A = -torch.rand(h, device="cuda") * 8
    B, C = _randn(b, g, n), _randn(b, g, n)
    D = _randn(h)
    if raw_dt:  # the mixer's projection: softplus(dt + dt_bias) inside the op
        dt, extra = _randn(b, h + 5)[:, :h], {"dt_bias": _randn(h) - 3, "dt_softplus": True}
    else:
        dt, extra = torch.nn.functional.softplus(torch.randn(b, h, device="cuda") - 2), {}
    ref_state = state.double()
    ref_extra = {k: (v.double() if torch.is_tensor(v) else v) for k, v in extra.items()}
    ref = ops.ssd_step(ref_state, x.double(), dt.double(), A.double(), B.double(), C.double(), D.double(), **ref_extra)
    out = _fast("ssd_step")(state, x, dt, A, B, C, D, **extra)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert _rel(out, ref) < 1e-2
    assert _rel(state, ref_state) < 1e-2


@pytest.mark.parametrize("rows,width,group", [(2, 4096, 4096), (3, 4096, 4096), (5, 256, 128)])
@gpu
def test_gated_rms_norm(rows, width, group):
    zx = _randn(rows, 1, 2 * width + 8)
    z, x = zx[..., :width], zx[..., width : 2 * width]  # strided views of one projection, as in the mixer
    w = _randn(width)
    ref = ops.gated_rms_norm(x.double(), z.double(), w.double(), 1e-5, group)
    out = _fast("gated_rms_norm")(x, z, w, 1e-5, group)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("length", [1, 100, 256, 300, 1000])
@pytest.mark.parametrize("with_state", [False, True])
@gpu
def test_ssd_scan(length, with_state):
    b, h, p, n, chunk = 2, 64, 64, 128, 256
    x = _randn(b, length, h, p)
    dt = torch.nn.functional.softplus(torch.randn(b, length, h, device="cuda") - 2)
    A = -torch.rand(h, device="cuda") * 8
    B, C = _randn(b, length, 1, n, scale=0.3), _randn(b, length, 1, n, scale=0.3)
    D = _randn(h)
    init = _randn(b, h, p, n) if with_state else None
    ref_init = None if init is None else init.double()
    x64 = (t.double() for t in (x, dt, A, B, C))
    ref_y, ref_final = ops.ssd_scan(*x64, chunk, D=D.double(), initial_state=ref_init)
    y, final = _fast("ssd_scan")(x, dt, A, B, C, chunk, D=D, initial_state=init)
    assert y.shape == x.shape and y.dtype == x.dtype and final.dtype == torch.float32
    assert _rel(y, ref_y) < 1e-2
    assert _rel(final, ref_final) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape,with_residual", [((2, 1, 2048), True), ((1, 1, 2048), False), ((2, 121, 2048), True)])
@gpu
def test_add_layer_norm(dtype, shape, with_residual):
    hidden = _randn(*shape, dtype=dtype)
    residual = _randn(*shape, dtype=dtype, scale=4.0) if with_residual else None
    w, bias = _randn(shape[-1], dtype=dtype), _randn(shape[-1], dtype=dtype)
    _, ref_sum = ops.add_layer_norm(hidden, residual, w, bias, 1e-5)  # the sum rounds in dtype here
    ref64, _ = ops.add_layer_norm(ref_sum.double(), None, w.double(), bias.double(), 1e-5)
    out, total = _fast("add_layer_norm")(hidden, residual, w, bias, 1e-5)
    assert out.dtype == dtype and total.dtype == dtype and out.shape == shape
    torch.testing.assert_close(total, ref_sum)
    assert _rel(out, ref64) < _tol(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "b,l,hq,hk,d,rotary_dim,interleaved,start",
    [(2, 1, 16, 4, 128, 128, False, 4000), (2, 121, 16, 4, 128, 128, False, 0), (1, 3, 4, 2, 16, 8, True, 17)],
)
@gpu
def test_rotate_and_cache(dtype, b, l, hq, hk, d, rotary_dim, interleaved, start):
    qkv = _randn(b, l, (hq + 2 * hk) * d, dtype=dtype)
    q, k, v = torch.split(qkv, [hq * d, hk * d, hk * d], -1)  # strided views of the fused projection
    q, k, v = q.view(b, l, hq, d), k.view(b, l, hk, d), v.view(b, l, hk, d)
    positions = torch.arange(start, start + l, device="cuda")
    max_seqlen = start + l + 5
    ref_k, ref_v = (torch.zeros(b, max_seqlen, hk, d, device="cuda", dtype=dtype) for _ in range(2))
    ref_q = ops.rotate_and_cache(q, k, v, ref_k, ref_v, positions, rotary_dim, 10000.0, interleaved)
    k_cache, v_cache = (torch.full_like(ref_k, float("nan")) for _ in range(2))  # poisoned
    out_q = _fast("rotate_and_cache")(q, k, v, k_cache, v_cache, positions, rotary_dim, 10000.0, interleaved)
    assert out_q.shape == q.shape and out_q.dtype == dtype
    assert _rel(out_q, ref_q) < _tol(dtype) and _rel(k_cache[:, positions], ref_k[:, positions]) < _tol(dtype)
    assert torch.equal(v_cache[:, positions], v)  # values are copied, not rounded
    others = torch.ones(max_seqlen, dtype=torch.bool, device="cuda")
    others[positions] = False
    assert k_cache[:, others].isnan().all() and v_cache[:, others].isnan().all()  # no other row written


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b,tables,length,rows,d", [(2, 9, 1, 1026, 2048), (1, 9, 121, 1026, 2048), (3, 2, 5, 7, 1500)])
@gpu
def test_embedding_sum(dtype, b, tables, length, rows, d):
    weight = _randn(tables * rows, d, dtype=dtype)
    ids = torch.randint(0, rows, (b, tables, length + 3), device="cuda")[..., 3:]  # a strided view
    ids[0, :, 0] = rows - 1  # each table's last row (one more would read the next table)
    poison = torch.full((b, length, d), float("nan"), device="cuda", dtype=dtype)
    del poison  # the op's output reuses this freed block of NaNs (the caching allocator), so every unwritten
    out = _fast("embedding_sum")(ids, weight, rows)  # element would show as NaN
    assert out.shape == (b, length, d) and out.dtype == dtype
    ref = ops.embedding_sum(ids, weight.double(), rows)
    assert _rel(out, ref) < _tol(dtype)  # bf16: the output's own rounding, ~1e-3
    torch.testing.assert_close(out, ops.embedding_sum(ids, weight, rows))  # fp32 sums rounded once, both


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 1, 2 * 8192), (1, 121, 2 * 8192), (3, 1, 2 * 1500 + 2)])
@gpu
def test_silu_mul(dtype, shape):
    h = _randn(*shape, dtype=dtype, scale=3.0)
    out = _fast("silu_mul")(h)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    torch.testing.assert_close(out, ops.silu_mul(h))  # both round SiLU, then the product, to dtype
    assert _rel(out, ops.silu_mul(h.double())) < _tol(dtype)


def test_missing_mamba_ssm_says_how_to_install_it(monkeypatch):
    import sys

    from zonos_accel.triton import mamba

    mamba.mamba_module.cache_clear()
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.triton.selective_state_update", None)  # its import fails
    with pytest.raises(ImportError, match=r"mamba_ssm.*pip install mamba-ssm"):
        mamba.mamba_module("selective_state_update")
    mamba.mamba_module.cache_clear()


def test_mamba_autotuning_is_kept_on_disk():
    """Every autotuned mamba_ssm kernel we load stores its tuning in Triton's cache, so a warm process does
    not benchmark configs again in its first request."""
    pytest.importorskip("mamba_ssm")
    from zonos_accel.triton import mamba

    mamba.mamba_module("ssd_combined")
    tuners = list(mamba.mamba_autotuners())
    assert len(tuners) > 10 and all(t.cache_results for t in tuners)


# ---- the CuTeDSL SSD scan (zonos_accel.ssd, use_cute_scan) against the float64 token-by-token recurrence


def _cute_scan():
    pytest.importorskip("cutlass", reason="the CuTeDSL scan needs nvidia-cutlass-dsl")
    from zonos_accel.ssd import ssd_scan

    return ssd_scan


def _poison_cuda():
    """NaN in the caching allocator's free memory: an output element the kernel never writes shows as NaN."""
    junk = torch.full((256 << 20,), float("nan"), device="cuda")
    del junk


def _scan_inputs(b, length, h=64, p=64, n=128, g=1, seed=0):
    """Mixer-like inputs: x, B and C as strided views of one conv output (bf16), positive fp32 step sizes, decay
    rates spread over the range of the checkpoints (slow heads keep a long memory, fast ones forget)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    xbc = torch.randn(b, length, h * p + 2 * g * n + 8, device="cuda", generator=gen).to(torch.bfloat16)
    x = xbc[..., : h * p].unflatten(-1, (h, p))
    B = xbc[..., h * p : h * p + g * n].unflatten(-1, (g, n))
    C = xbc[..., h * p + g * n : h * p + 2 * g * n].unflatten(-1, (g, n))
    dt = torch.nn.functional.softplus(torch.randn(b, length, h, device="cuda", generator=gen) - 2)
    A = -torch.exp(torch.empty(h, device="cuda").uniform_(-3, 2, generator=gen))
    D = torch.randn(h, device="cuda", generator=gen)
    return x, dt, A, B, C, D


_references: dict[tuple, tuple] = {}


def _sequential64(x, dt, A, B, C, D, init):
    """The recurrence one token at a time in float64 (zonos.ops.ssd_step): the specification of the scan."""
    b, length, h, p = x.shape
    state = torch.zeros(b, h, p, B.shape[-1], device="cuda", dtype=torch.float64) if init is None else init.double()
    x, dt, A, B, C, D = (t.double() for t in (x, dt, A, B, C, D))
    y = torch.empty(b, length, h, p, device="cuda", dtype=torch.float64)
    for t in range(length):
        y[:, t] = ops.ssd_step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t], D)
    return y, state


@pytest.mark.parametrize("batched_loads", [False, True])  # outermost: varies fastest, so references are reused
@pytest.mark.parametrize("length", [1, 7, 60, 120, 255, 256, 257, 1000, 4096])
@pytest.mark.parametrize("init", [None, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("b", [2, 16])
@gpu
def test_cute_ssd_scan_matches_the_recurrence(length, init, b, batched_loads, monkeypatch):
    """bf16 inputs: y within 5e-3 and the fp32 final state within 1e-3 (relative L2) of the float64 recurrence,
    with either way of loading the chunk (zonos_accel.ssd.BATCHED_LOADS)."""
    if b == 16 and length == 4096 and init is torch.float32:
        pytest.skip("covered by the bf16 initial state at this size (the fp32 path is the chunk loop's)")
    if batched_loads and b == 16 and length not in (120, 257):
        pytest.skip("the loads do not depend on the batch: two lengths at batch 16")
    scan = _cute_scan()
    import zonos_accel.ssd

    monkeypatch.setattr(zonos_accel.ssd, "BATCHED_LOADS", batched_loads)
    x, dt, A, B, C, D = _scan_inputs(b, length, seed=length + b)
    gen = torch.Generator(device="cuda").manual_seed(length)
    s0 = None if init is None else (0.5 * torch.randn(b, 64, 64, 128, device="cuda", generator=gen)).to(init)
    key = (b, length, init)
    if key not in _references:
        _references.clear()  # keep one (up to 1 GB at batch 16, 4096 tokens)
        _references[key] = _sequential64(x, dt, A, B, C, D, s0)
    y_ref, final_ref = _references[key]
    _poison_cuda()
    y, final = scan(x, dt, A, B, C, 256, D=D, initial_state=s0)
    assert y.shape == x.shape and y.dtype == x.dtype and final.shape == final_ref.shape and final.dtype == torch.float32
    assert _rel(y, y_ref) <= 5e-3
    assert _rel(final, final_ref) <= 1e-3


@pytest.mark.parametrize("batched_loads", [False, True])
@pytest.mark.parametrize("h,p,n,g,length", [(8, 32, 64, 2, 77), (4, 16, 128, 4, 300), (6, 48, 64, 3, 5)])
@gpu
def test_cute_ssd_scan_ragged_shapes(h, p, n, g, length, batched_loads, monkeypatch):
    """Other head sizes, state sizes and groups, without D, with either way of loading the chunk."""
    scan = _cute_scan()
    import zonos_accel.ssd

    monkeypatch.setattr(zonos_accel.ssd, "BATCHED_LOADS", batched_loads)
    x, dt, A, B, C, D = _scan_inputs(3, length, h, p, n, g, seed=h * p)
    s0 = torch.randn(3, h, p, n, device="cuda").to(torch.bfloat16)
    y_ref, final_ref = _sequential64(x, dt, A, B, C, torch.zeros_like(D), s0)
    _poison_cuda()
    y, final = scan(x, dt, A, B, C, 256, initial_state=s0)
    assert _rel(y, y_ref) <= 5e-3
    assert _rel(final, final_ref) <= 1e-3


_DEFAULT_SCAN_CHILD = """
import json, sys, torch
from tests.tiny import tiny_config
from zonos.config import ZonosConfig
from zonos.model import Zonos
cfg = tiny_config("hybrid")
cfg["backbone"]["ssm_cfg"].update(d_state=64, headdim=16)  # shapes the CuTeDSL scan takes
torch.manual_seed(0)
model = Zonos(ZonosConfig.from_dict(cfg), max_seqlen=128).to("cuda", torch.bfloat16).eval()
model.use_accelerators()
prefix = torch.randn(2, 40, 64, device="cuda", dtype=torch.bfloat16)
gen = torch.Generator("cuda").manual_seed(1)
codes = model.generate(prefix, max_new_tokens=12, progress_bar=False, generator=gen)
found = [model.backend.name, "mamba_ssm" in sys.modules, list(codes.shape), codes.min().item(), codes.max().item()]
print(json.dumps(found))
"""


@gpu
def test_default_accelerators_scan_on_cute_without_importing_mamba_ssm():
    """use_accelerators() with nothing asked: the prefill scan is the CuTeDSL kernel, mamba_ssm (and the
    transformers import behind it) stays unloaded, and a request runs through it (a fresh process: other tests
    import mamba_ssm)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("cutlass", reason="the CuTeDSL scan needs nvidia-cutlass-dsl")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", _DEFAULT_SCAN_CHILD], cwd=root, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    name, mamba_loaded, shape, low, high = json.loads(out.stdout.splitlines()[-1])
    assert name.endswith("+cute_scan") and not mamba_loaded, out.stdout
    assert shape == [1, 9, 12] and 0 <= low <= high <= 1025, out.stdout


@gpu
def test_cute_ssd_scan_propagates_nan():
    """A NaN in one input element reaches that channel's output at its token and every later one, and the final
    state's row of that channel; other sequences and heads stay finite. (Tokens before it in its 16-token block
    may turn NaN too, as the reference's masked einsum makes them: 0 · NaN.)"""
    scan = _cute_scan()
    x, dt, A, B, C, D = _scan_inputs(2, 100, seed=9)
    x = x.clone()
    x[1, 40, 3, 5] = float("nan")
    y, final = scan(x, dt, A, B, C, 256, D=D)
    assert torch.isnan(y[1, 40:, 3, 5]).all() and torch.isfinite(y[0]).all()
    assert torch.isfinite(y[1, :, :3]).all() and torch.isfinite(y[1, :, 4:]).all() and torch.isfinite(y[1, :32]).all()
    assert torch.isnan(final[1, 3, 5]).all() and torch.isfinite(final[0]).all() and torch.isfinite(final[1, :3]).all()


@gpu
def test_cute_ssd_scan_graph_replays_new_inputs():
    """Captured once (as prefill is), replayed with new inputs in place: new, correct outputs and states."""
    scan = _cute_scan()
    x, dt, A, B, C, D = _scan_inputs(2, 120, seed=1)
    s0 = torch.randn(2, 64, 64, 128, device="cuda").to(torch.bfloat16)
    scan(x, dt, A, B, C, 256, D=D, initial_state=s0)  # compile and load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, final = scan(x, dt, A, B, C, 256, D=D, initial_state=s0)
    for seed in (2, 3):
        x2, dt2, _, B2, C2, _ = _scan_inputs(2, 120, seed=seed)
        for dst, src in ((x, x2), (dt, dt2), (B, B2), (C, C2)):
            dst.copy_(src)
        s0.normal_()
        y.fill_(float("nan"))
        final.fill_(float("nan"))
        graph.replay()
        y_ref, final_ref = _sequential64(x, dt, A, B, C, D, s0)
        assert _rel(y, y_ref) <= 5e-3 and _rel(final, final_ref) <= 1e-3
