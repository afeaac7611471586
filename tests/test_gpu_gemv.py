"""The CuTeDSL GEMV on the GPU: against a float64 reference (no worse than cuBLAS's own error) at every
Zonos-v0.1-hybrid projection shape and M = 1..8, at ragged shapes (N and K off the tiles, split-K), for
every work split the benchmark times, and inside CUDA graphs (replays with new inputs give new outputs,
so the kernel was launched on the capture stream). Outputs are poisoned with NaN before each check."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from zonos.ops.backend import REFERENCE
from zonos_accel.gemv.config import (
    candidate_configs,
    mma_candidates,
    mma_config,
    occupancy_candidates,
    warps_candidates,
)

HAVE_CUTLASS = importlib.util.find_spec("cutlass") is not None

# Zonos-v0.1-hybrid (N, K): Mamba2 in/out, attention qkv/out, MLP fc1/fc2, the 9 heads fused (padded to 9232 rows).
ZONOS_SHAPES = [(8512, 2048), (2048, 4096), (3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (9232, 2048)]
# N off the row tiles, K off the warp chunks (2056 = 8 · 257, 2040 = 8 · 255), few rows (split-K), tiny.
RAGGED_SHAPES = [(1000, 2056), (1000, 2040), (100, 8200), (24, 16384), (7, 8), (1, 24)]


def gpu(test):
    skip = pytest.mark.skipif(
        not torch.cuda.is_available() or not HAVE_CUTLASS, reason="needs a CUDA device and nvidia-cutlass-dsl"
    )
    return pytest.mark.gpu(skip(test))


def _gemv(*args, **kwargs):
    from zonos_accel.gemv import gemv

    return gemv(*args, **kwargs)


def _rel(out, ref):
    assert torch.isfinite(out).all()
    return ((out.double() - ref).norm() / ref.norm()).item()


def _problem(m, n, k, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=g) * k**-0.5).to(dtype)
    return x, w, x.double() @ w.double().T


def _check(m, n, k, dtype=torch.bfloat16, config=None, seed=0):
    x, w, ref = _problem(m, n, k, dtype, seed)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    assert _gemv(x, w, out=out, config=config) is out
    torch.cuda.synchronize()
    ours, cublas, ideal = _rel(out, ref), _rel(F.linear(x, w), ref), _rel(ref.to(dtype), ref)
    # Both round an fp32 sum once to 16 bits, so both errors are about that rounding (``ideal``: the float64
    # result rounded, the least any 16-bit output can have); a few outputs (tiny N) may differ by one flip.
    assert ours <= max(1.01 * cublas, 1.02 * ideal) + 1e-6, (ours, cublas, ideal)
    assert ours < 5e-3


@pytest.mark.parametrize("m", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("n,k", ZONOS_SHAPES)
@gpu
def test_zonos_shapes(n, k, m):
    _check(m, n, k)


@pytest.mark.parametrize("m", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("n,k", RAGGED_SHAPES)
@gpu
def test_ragged_shapes(n, k, m):
    _check(m, n, k)


@pytest.mark.parametrize("n,k", [(8512, 2048), (2048, 8192), (1000, 2056), (100, 8200)])
@gpu
def test_every_benchmarked_split(n, k):
    for config in candidate_configs(2, n, k):
        _check(2, n, k, config=config)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("n,k", ZONOS_SHAPES + RAGGED_SHAPES)
@gpu
def test_tensor_core_split(n, k, m):
    _check(m, n, k, config=mma_config(m, n, k))
    _check(m, n, k, dtype=torch.float16, config=mma_config(m, n, k))


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("n,k", [(8512, 2048), (2048, 8192), (1000, 2056), (100, 8200)])
@gpu
def test_every_benchmarked_tensor_core_split(n, k, m):
    for config in mma_candidates(m, n, k):
        _check(m, n, k, config=config)


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("n,k", [(8512, 2048), (2048, 8192), (1000, 2056)])
@gpu
def test_every_occupancy_split(n, k, m):
    """Splits compiled to fit 4-8 CTAs per SM (``min_ctas``), some spilling registers, still compute the product."""
    for config in occupancy_candidates(m, n, k):
        _check(m, n, k, config=config)


@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("n,k", [(8512, 2048), (3072, 2048), (2048, 8192), (1000, 2056)])
@gpu
def test_every_warps_split(n, k, m):
    """Splits with 1 or 2 warps along K (more iterations per warp) compute the product."""
    for config in warps_candidates(m, n, k):
        _check(m, n, k, config=config)


@pytest.mark.parametrize("n,k", [(3072, 2048), (1000, 2056)])
@gpu
def test_float16(n, k):
    _check(2, n, k, dtype=torch.float16)


@gpu
def test_leading_dims_and_strided_x():
    x, w, _ = _problem(6, 3072, 2048)
    x3 = x.view(2, 3, 2048)
    assert torch.equal(_gemv(x3, w), _gemv(x, w).view(2, 3, 3072))
    wide = torch.randn(2, 2 * 2048 + 8, device="cuda", dtype=torch.bfloat16)
    strided = wide[:, 8 : 8 + 2048]  # rows 16-byte aligned, not contiguous
    odd = wide.view(-1)[1 : 1 + 2 * 2048].view(2, 2048)  # contiguous, not 16-byte aligned
    for xs in (strided, odd):
        assert torch.equal(_gemv(xs, w), _gemv(xs.contiguous().clone(), w))


@pytest.mark.parametrize("n,k", [(8512, 2048), (100, 8200)])  # one launch; split-K (two launches)
@gpu
def test_graph_replays_new_inputs(n, k):
    x, w, _ = _problem(2, n, k)
    out = torch.empty(2, n, device="cuda", dtype=torch.bfloat16)
    _gemv(x, w, out=out)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):  # a side stream, as the decode runner uses
        _gemv(x, w, out=out)
    g = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(3):
        x.copy_(torch.randn(x.shape, device="cuda", generator=g))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(out, x.double() @ w.double().T) < 5e-3  # NaN left if the launch escaped the capture


@gpu
def test_routed_linear():
    """The backend's ``linear`` (what ``use_cute_gemv`` gives a model) sends decode-shaped calls to the kernel,
    prefill-shaped ones to cuBLAS, and is captured in a graph; the reference backend is left as it was."""
    from zonos_accel.gemv import cute_gemv_backend

    x, w, _ = _problem(2, 3072, 2048)
    bias = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
    prefill = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    linear = cute_gemv_backend(REFERENCE).linear
    with torch.inference_mode():
        assert torch.equal(linear(x[:, None], w)[:, 0], _gemv(x, w))
        assert torch.equal(linear(x, w, bias), _gemv(x, w) + bias)
        assert torch.equal(linear(prefill, w), F.linear(prefill, w))  # prefill stays on cuBLAS
        assert torch.equal(REFERENCE.linear(x, w), F.linear(x, w))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            y = linear(x, w)
        x.copy_(torch.randn_like(x))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(y, x.double() @ w.double().T) < 5e-3


@pytest.mark.parametrize("tensor_cores", [False, True])
@pytest.mark.parametrize("graphed", [False, True])
@gpu
def test_pdl_chain_waits_for_its_input(graphed, tensor_cores):
    """Programmatic dependent launch: each kernel of a chain may start while the previous one drains, but
    must read its x only after that kernel finished. The intermediates are poisoned with NaN before each
    run, so a kernel that read early would leave NaN (or a stale value) in its output."""
    from dataclasses import replace

    from zonos_accel.gemv.config import fma_config

    dims = [2048, 8192, 2048, 8512, 2048, 4096, 2048]
    g = torch.Generator(device="cuda").manual_seed(2)
    ws = [(torch.randn(n, k, device="cuda", generator=g) * k**-0.5).to(torch.bfloat16) for k, n in zip(dims, dims[1:])]
    x = torch.randn(2, dims[0], device="cuda", generator=g).to(torch.bfloat16)
    outs = [torch.empty(2, n, device="cuda", dtype=torch.bfloat16) for n in dims[1:]]

    def chain():
        y = x
        for w, out in zip(ws, outs):
            config = (mma_config if tensor_cores else fma_config)(2, *w.shape)
            y = _gemv(y, w, out=out, config=replace(config, pdl=True))

    chain()  # compile outside the capture
    torch.cuda.synchronize()
    run = chain
    if graphed:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            chain()
        run = graph.replay
    for _ in range(3):
        x.copy_(torch.randn(x.shape, device="cuda", generator=g))
        for out in outs:
            out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        for inp, w, out in zip([x] + outs, ws, outs):
            assert _rel(out, inp.double() @ w.double().T) < 5e-3


@gpu
def test_first_call_inside_capture_is_a_clear_error():
    x, w, _ = _problem(2, 520, 2048)  # a shape no other test compiles
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="first called inside CUDA-graph capture"):
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            _gemv(x, w)
