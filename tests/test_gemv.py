"""The CuTeDSL GEMV backend (``cute_gemv_backend``, the ``linear`` op of ``use_cute_gemv``) on the CPU: which
calls it takes, the errors that name what is missing, and its work split (every weight vector read exactly
once, for every Zonos shape and ragged ones). The kernel itself runs in tests/test_gpu_gemv.py."""

import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import zonos_accel.gemv as cute_gemv
from zonos.ops.backend import COMPOSITES, OP_NAMES, REFERENCE
from zonos.ops.linear import linear as reference_linear
from zonos_accel.gemv.config import (
    MAX_ROWS,
    MMA_LANES_K,
    TUNED,
    VEC,
    WARP,
    FmaConfig,
    MmaConfig,
    candidate_configs,
    cdiv,
    fma_config,
    gemv_config,
    mma_candidates,
    mma_config,
    occupancy_candidates,
    warps_candidates,
)

# Zonos-v0.1-hybrid (N, K): Mamba2 in/out, attention qkv/out, MLP fc1/fc2, the 9 heads fused (padded to 9232 rows).
ZONOS_SHAPES = [(8512, 2048), (2048, 4096), (3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (9232, 2048)]
RAGGED_SHAPES = [(1000, 2056), (1000, 2040), (100, 8200), (24, 16384), (7, 8), (1, 24)]


def test_reference_is_f_linear():
    x, w, b = torch.randn(3, 5, 16), torch.randn(7, 16), torch.randn(7)
    assert torch.equal(REFERENCE.linear(x, w), F.linear(x, w))
    assert torch.equal(REFERENCE.linear(x, w, b), F.linear(x, w, b))
    assert REFERENCE.linear is reference_linear


def test_backend_without_cuda_names_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        cute_gemv.cute_gemv_backend()


def test_backend_without_cutlass_names_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "cutlass", None)  # makes `import cutlass` fail
    monkeypatch.delitem(sys.modules, "zonos_accel.gemv.kernel", raising=False)
    with pytest.raises(ImportError, match="nvidia-cutlass-dsl"):
        cute_gemv.cute_gemv_backend()


def test_gemv_refuses_cpu_tensors():
    with pytest.raises(ValueError, match="CUDA device"):
        cute_gemv.gemv(torch.randn(2, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16))


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend the CPU is a CUDA device with the kernel installed; record which calls reach the kernel."""
    calls = []

    def fake_gemv(x, weight, out=None, config=None):
        calls.append(tuple(x.shape))
        return F.linear(x, weight)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cute_gemv, "kernel_module", lambda: None)
    monkeypatch.setattr(cute_gemv, "_same_cuda_device", lambda x, weight: True)
    monkeypatch.setattr(cute_gemv, "gemv", fake_gemv)
    return calls


def _bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def test_backend_replaces_linear_only_and_leaves_its_base_alone(fake_gpu):
    backend = cute_gemv.cute_gemv_backend(REFERENCE)
    assert backend is not REFERENCE and backend.name == "torch+cute_gemv"
    assert backend.linear is not reference_linear and REFERENCE.linear is reference_linear
    kept = [name for name in OP_NAMES if name != "linear" and name not in COMPOSITES]  # composites use the new linear
    assert all(backend.op(name) is REFERENCE.op(name) for name in kept)
    with torch.no_grad():
        REFERENCE.linear(_bf16(2, 64), _bf16(48, 64))  # the base backend never reaches the kernel
    assert fake_gpu == []


@torch.no_grad()
def test_decode_shaped_calls_reach_the_kernel(fake_gpu):
    linear = cute_gemv.cute_gemv_backend().linear
    w = _bf16(48, 64)
    for x in (_bf16(2, 64), _bf16(2, 1, 64), _bf16(1, 64), _bf16(MAX_ROWS, 64), _bf16(2, 2, 64)):
        assert torch.equal(linear(x, w), F.linear(x, w))
    assert fake_gpu == [(2, 64), (2, 1, 64), (1, 64), (MAX_ROWS, 64), (2, 2, 64)]


@torch.no_grad()
def test_other_calls_keep_the_reference(fake_gpu):
    linear = cute_gemv.cute_gemv_backend().linear
    w = _bf16(48, 64)
    linear(_bf16(MAX_ROWS + 1, 64), w)  # prefill-sized
    linear(_bf16(2, 1, 64).expand(2, 9, 64), w)  # 18 rows
    linear(torch.randn(2, 64), w.float())  # fp32
    with pytest.raises(RuntimeError):  # mixed dtypes: the reference's own error
        linear(_bf16(2, 64), w.half())
    linear(_bf16(2, 12), _bf16(48, 12))  # K not a multiple of 8
    linear(_bf16(2, 64), _bf16(64, 48).t())  # non-contiguous weight
    linear(_bf16(2, 64), _bf16(48 * 64 + 1)[1:].view(48, 64))  # weight not 16-byte aligned
    linear(_bf16(0, 64), w)  # no rows
    assert fake_gpu == []


def test_autograd_keeps_the_reference(fake_gpu):
    linear = cute_gemv.cute_gemv_backend().linear
    w = _bf16(48, 64).requires_grad_()
    linear(_bf16(2, 64), w).float().sum().backward()
    assert fake_gpu == [] and w.grad is not None
    with torch.no_grad():
        linear(_bf16(2, 64), w)
    assert fake_gpu == [(2, 64)]


@torch.no_grad()
def test_bias_and_row_limit(fake_gpu):
    linear = cute_gemv.cute_gemv_backend(max_rows=4).linear
    x, w, b = _bf16(4, 64), _bf16(48, 64), _bf16(48)
    assert torch.equal(linear(x, w, b), F.linear(x, w) + b)
    linear(_bf16(5, 64), w)
    assert fake_gpu == [(4, 64)]
    REFERENCE.linear(x, w)
    assert fake_gpu == [(4, 64)]
    with pytest.raises(ValueError, match="max_rows must be positive"):
        cute_gemv.cute_gemv_backend(max_rows=0)


@torch.no_grad()
def test_real_cpu_tensors_never_reach_the_kernel(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cute_gemv, "kernel_module", lambda: None)
    linear = cute_gemv.cute_gemv_backend().linear
    x, w = _bf16(2, 64), _bf16(48, 64)
    assert not cute_gemv.supports(x, w)
    assert torch.equal(linear(x, w), F.linear(x, w))


def _split_cases():
    """(m, n, k, split) for every tuned and candidate split of one kernel (FmaConfig or MmaConfig)."""
    for n, k in ZONOS_SHAPES:
        for m in (1, 2, 4):
            yield m, n, k, gemv_config(m, n, k)
            yield from ((m, n, k, cfg) for cfg in candidate_configs(m, n, k) + mma_candidates(m, n, k))
            yield from ((m, n, k, cfg) for cfg in warps_candidates(m, n, k))
    for n, k in RAGGED_SHAPES + [(3072, 2048)]:
        for m in (1, 2, 3, 8, 16):
            yield m, n, k, gemv_config(m, n, k)
            if m <= 8:
                yield from ((m, n, k, cfg) for cfg in mma_candidates(m, n, k))
        for cfg in candidate_configs(2, n, k)[1:]:
            yield 2, n, k, cfg


def _cases(kind):
    unique = []
    for case in _split_cases():
        if isinstance(case[3], kind) and case not in unique:
            unique.append(case)
    return unique


def _grid(sizes):
    """One index tensor per entry of ``sizes``, each varying along its own dimension."""
    return [torch.arange(size).view([-1 if d == i else 1 for d in range(len(sizes))]) for i, size in enumerate(sizes)]


def _sample_rows(n, cfg):
    """Row blocks are alike: 64 of them (and the ragged tail, if any) stand for all, keeping the tests fast."""
    return min(n, n % cfg.rows_per_cta + 64 * cfg.rows_per_cta)


def _assert_each_vector_once(row, kv, cfg, n, k):
    kvecs = k // VEC
    if cfg.k_exact(k):
        assert (kv < kvecs).all()
    if cfg.n_exact(n):
        assert (row < n).all()
    inside = (row < n) & (kv < kvecs)
    counts = torch.bincount((row * kvecs + kv)[inside], minlength=n * kvecs)
    assert counts.numel() == n * kvecs and (counts == 1).all()


@pytest.mark.parametrize("m,n,k,cfg", _cases(FmaConfig))
def test_split_reads_every_weight_vector_once(m, n, k, cfg):
    """Replays FmaGemv's index map (the same FmaConfig methods it calls) over every lane of the grid."""
    cfg.check(m, n, k)
    n = _sample_rows(n, cfg)
    assert cfg.threads <= 1024 and cfg.splits <= cdiv(cdiv(k // VEC, WARP * cfg.vecs), cfg.warps_k)
    sizes = (cfg.row_blocks(n), cfg.splits, cfg.warps_n, cfg.warps_k, WARP, cfg.iters(k), cfg.vecs, cfg.rows)
    block, split, group, warp_k, lane, it, v, r = _grid(sizes)
    row = (cfg.first_row(block, group) + r).expand(sizes)
    _assert_each_vector_once(row, cfg.kvec(it, split, warp_k, lane, v).expand(sizes), cfg, n, k)
    # Each (row, split) is summed by exactly one CTA: a row block's warps_n groups own disjoint rows.
    first_lane = (row < n) & (warp_k == 0) & (lane == 0) & (it == 0) & (v == 0)
    owners = torch.bincount((row * cfg.splits + split.expand(sizes))[first_lane])
    assert (owners == 1).all() and owners.numel() == n * cfg.splits


@pytest.mark.parametrize("m,n,k,cfg", _cases(MmaConfig))
def test_tensor_core_split_reads_every_weight_vector_once(m, n, k, cfg):
    """The same replay for MmaGemv's map: lane 4 g + c loads vector kvec(.., c, step) of row g of each tile, and
    of row g + 8 too in 16-row tiles."""
    cfg.check(m, n, k)
    n = _sample_rows(n, cfg)
    sizes = (
        cfg.row_blocks(n), cfg.splits, cfg.warps_n, cfg.warps_k, WARP // MMA_LANES_K, MMA_LANES_K, cfg.iters(k),
        cfg.ksteps, cfg.halves, cfg.tiles,
    )  # fmt: skip
    block, split, group, warp_k, g, c, it, step, half, tile = _grid(sizes)
    row = (cfg.first_row(block, group) + cfg.tile_rows * tile + 8 * half + g).expand(sizes)
    _assert_each_vector_once(row, cfg.kvec(it, split, warp_k, c, step).expand(sizes), cfg, n, k)


def test_default_split_fills_the_gpu():
    """No split-K for Zonos shapes (enough warps from the rows alone: 1024, ~8 per SM); split-K where the rows
    alone leave SMs idle."""
    for n, k in ZONOS_SHAPES:
        for m in (1, 2, 4):
            cfg = gemv_config(m, n, k)
            assert cfg.splits == 1 and cfg.row_blocks(n) * cfg.threads // WARP >= 1024 and cfg.threads >= 128
    assert gemv_config(2, 100, 8200).splits > 1
    assert gemv_config(1, 24, 16384).splits > 1


def test_tensor_core_split_k_can_be_turned_off():
    """``split_k=False`` keeps the whole of K in one CTA per row block, as TUNED pins for out_proj and fc2 at M = 4."""
    split = mma_config(4, 2048, 4096, ksteps=4, warps_k=16, half=True)
    unsplit = mma_config(4, 2048, 4096, ksteps=4, warps_k=16, half=True, split_k=False)
    assert split.splits > 1 and unsplit.splits == 1
    assert (unsplit.warps_k, unsplit.warps_n) == (split.warps_k, split.warps_n)
    assert gemv_config(4, 2048, 4096) == unsplit and gemv_config(4, 2048, 8192).splits == 1


def test_config_rejects_what_the_kernel_cannot_do():
    with pytest.raises(ValueError, match="multiple of 8"):
        gemv_config(2, 64, 12).check(2, 64, 12)
    cfg = gemv_config(2, 64, 2048)
    with pytest.raises(ValueError, match="splits"):
        type(cfg)(vecs=8, rows=1, warps_k=1, warps_n=4, splits=2).check(2, 64, 2048)
    with pytest.raises(ValueError, match="at most 8 rows of x, got M = 9"):
        mma_config(8, 64, 2048).check(9, 64, 2048)
    with pytest.raises(ValueError, match="2048 threads per CTA exceed 1024"):
        mma_config(2, 64, 2048, ksteps=1, warps_k=64).check(2, 64, 2048)
    mma = mma_config(2, 8512, 2048, warps_k=8, half=True)  # 256 threads: 8 CTAs fill an SM's 2048 threads
    replace(mma, min_ctas=8).check(2, 8512, 2048)
    with pytest.raises(ValueError, match="9 CTAs of 256 threads cannot share an SM"):
        replace(mma, min_ctas=9).check(2, 8512, 2048)
    with pytest.raises(ValueError, match="CTAs of 128 threads cannot share an SM"):
        replace(fma_config(2, 8512, 2048), min_ctas=-1).check(2, 8512, 2048)


def test_occupancy_candidates_impose_occupancy_on_the_tuned_and_v1_r8_splits():
    for m, n, k in ((1, 8512, 2048), (2, 8512, 2048), (4, 2048, 8192)):
        configs = occupancy_candidates(m, n, k)
        assert configs[0] == gemv_config(m, n, k)
        assert {replace(c, min_ctas=0) for c in configs} == {
            gemv_config(m, n, k),
            fma_config(m, n, k, vecs=1, rows=8, stream_loads=False),
        }
        assert all(c.min_ctas * c.threads <= 2048 for c in configs) and len(set(configs)) == len(configs)


def test_warps_candidates_cap_the_warps_along_k():
    for m, n, k in ((1, 8512, 2048), (2, 3072, 2048), (4, 2048, 8192), (2, 1000, 2056)):
        configs = warps_candidates(m, n, k)
        assert configs[0] == gemv_config(m, n, k) and len(set(configs)) == len(configs)
        fma = [c for c in configs[1:] if isinstance(c, FmaConfig)]
        assert {c.warps_k for c in fma} >= {1, 2} and all(not c.stream_loads for c in fma)


def test_a_pinned_fma_split_may_cap_the_warps_along_k(monkeypatch):
    monkeypatch.setitem(TUNED, (2, 3072, 2048), ("fma", 2, 4, False, 2))
    cfg = gemv_config(2, 3072, 2048)
    assert cfg == fma_config(2, 3072, 2048, vecs=2, rows=4, stream_loads=False, max_warps_k=2) and cfg.warps_k == 2
    monkeypatch.setitem(TUNED, (2, 3072, 2048), ("fma", 2, 4, False))
    assert gemv_config(2, 3072, 2048).warps_k == 4


def _hopper_ptx(m, n, k, cfg, tmp_path) -> str:
    """Compile for sm_90a without a GPU; the PTX. Code generation writes the PTX and cubin; the JIT step after it
    needs a CUDA driver and fails without one, so its error counts only once both files exist."""
    from zonos_accel.gemv import kernel

    bf16 = kernel.CUTE_DTYPES[torch.bfloat16]
    options = f"--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir {tmp_path}"
    try:
        kernel.compile_gemv(bf16, m, n, k, cfg, kernel.launch_args(bf16, 16, 16, 16, 16, 0), options)
    except Exception:
        if not (list(tmp_path.glob("*.ptx")) and list(tmp_path.glob("*.cubin"))):
            raise
    ptx = "".join(p.read_text(errors="replace") for p in tmp_path.glob("*.ptx"))
    assert ".target sm_90a" in ptx
    return ptx


@pytest.mark.parametrize(
    "m,n,k,stream_loads,pdl",
    [
        (2, 8512, 2048, False, True),
        (2, 9225, 2048, True, True),
        (3, 1000, 2056, False, True),
        (2, 2048, 4096, True, False),
    ],
)
def test_kernel_compiles_for_hopper(m, n, k, stream_loads, pdl, tmp_path):
    """With nvidia-cutlass-dsl installed, the kernel compiles to sm_90a PTX and cubin without a GPU."""
    if torch.cuda.is_available():
        pytest.skip("the GPU tests compile and run the kernel")
    pytest.importorskip("cutlass")
    from dataclasses import replace

    cfg = replace(fma_config(m, n, k), stream_loads=stream_loads, pdl=pdl)
    ptx = _hopper_ptx(m, n, k, cfg, tmp_path)
    loads = "ld.global.nc.L1::no_allocate.L2::256B.v4.b32" if stream_loads else "ld.global.v4.b32"
    vectors = cdiv(cdiv(k // VEC, WARP * cfg.vecs), cfg.warps_k * cfg.splits) * cfg.vecs
    assert ptx.count(loads) >= vectors * cfg.rows  # every weight load is one 128-bit load
    # hoist_loads: the first iteration's weight loads all come before the wait for the previous kernel (pdl) or
    # the barrier that no load crosses, and x's loads after it
    separator = "griddepcontrol.wait" if cfg.pdl else "bar.sync"
    assert ptx.split(separator)[0].count(loads) == cfg.vecs * cfg.rows


@pytest.mark.parametrize("m,n,k,half", [(2, 8512, 2048, True), (4, 2048, 2048, False), (3, 1000, 2056, True)])
def test_tensor_core_kernel_compiles_for_hopper(m, n, k, half, tmp_path):
    """MmaGemv compiles to sm_90a with one 128-bit load per weight vector and two mma.sync per 32-element k-step
    and tile, all of the first iteration's weight loads before the wait for the previous kernel."""
    if torch.cuda.is_available():
        pytest.skip("the GPU tests compile and run the kernel")
    pytest.importorskip("cutlass")
    cfg = mma_config(m, n, k, ksteps=4, warps_k=8, half=half)
    ptx = _hopper_ptx(m, n, k, cfg, tmp_path)
    steps = cfg.iters(k) * cfg.ksteps
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 2 * steps * cfg.tiles
    loads = "ld.global.nc.L1::no_allocate.L2::256B.v4.b32"
    assert ptx.count(loads) == steps * cfg.tiles * cfg.halves
    assert ptx.split("griddepcontrol.wait")[0].count(loads) == cfg.ksteps * cfg.tiles * cfg.halves
