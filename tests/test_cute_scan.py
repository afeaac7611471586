"""What the CuTeDSL SSD scan (zonos_accel/ssd, ``use_cute_scan``) does on a machine that cannot run it, and that it
compiles for Hopper without a GPU. Its results against the float64 recurrence are GPU tests in test_gpu_ops.py."""

from __future__ import annotations

import sys

import pytest
import torch

from zonos.errors import ZonosInputError


def _inputs(b=2, length=10, h=4, p=16, n=64, g=1, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, length, h, p, generator=gen).to(dtype)
    dt = torch.rand(b, length, h, generator=gen)
    A = -torch.rand(h, generator=gen)
    B = torch.randn(b, length, g, n, generator=gen).to(dtype)
    C = torch.randn(b, length, g, n, generator=gen).to(dtype)
    return x, dt, A, B, C


def test_importing_needs_neither_cuda_nor_cutlass(monkeypatch):
    monkeypatch.setitem(sys.modules, "cutlass", None)
    monkeypatch.delitem(sys.modules, "zonos_accel.ssd", raising=False)
    monkeypatch.delitem(sys.modules, "zonos_accel.ssd.kernel", raising=False)
    import zonos_accel.ssd as ssd

    with pytest.raises(ImportError, match="nvidia-cutlass-dsl"):
        ssd.kernel_module()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-only machine's errors")
def test_without_cuda_the_scan_is_a_clear_error():
    from zonos_accel.ssd import require_cute_scan, ssd_scan

    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        require_cute_scan()
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        ssd_scan(*_inputs(), 256)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda x, dt, A, B, C: (x, dt[:, :-1], A, B, C), "agree"),
        (lambda x, dt, A, B, C: (x.float(), dt, A, B, C), "bf16"),
        (lambda x, dt, A, B, C: (x[..., :8].contiguous(), dt, A, B, C), "head dim"),
        (lambda x, dt, A, B, C: (x, dt, A, B[..., :48], C[..., :48]), "state 64 or 128"),
    ],
)
def test_bad_inputs_name_the_problem(change, match):
    from zonos_accel.ssd import ssd_scan

    with pytest.raises(ZonosInputError, match=match):
        ssd_scan(*change(*_inputs()), 256)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile and run the kernel")
def test_kernel_compiles_for_hopper(tmp_path):
    """With nvidia-cutlass-dsl installed, the fused chunk kernel compiles to sm_90a PTX and cubin without a GPU:
    the tensor-core products of a chunk with an fp32 initial state are all there. (Code generation
    writes both files; the JIT step after it needs a CUDA driver, so its error counts only once they exist.)"""
    pytest.importorskip("cutlass")
    from zonos_accel.ssd import kernel

    x, dt, A, B, C = _inputs(length=128, h=2, p=64, n=128)
    s0 = torch.zeros(2, 2, 64, 128)
    y, sf = torch.empty_like(x), torch.empty(2, 2, 64, 128)
    strides = (x.stride(0), x.stride(1), dt.stride(0), dt.stride(1), B.stride(0), B.stride(1))
    strides += (C.stride(0), C.stride(1), y.stride(0), y.stride(1))
    args = kernel.launch_args(x, dt, A, B, C, A, s0, y, sf, 128, strides, 2, 0)
    scan = kernel.ChunkScan(64, 128, has_init=True, init_fp32=True)
    try:
        kernel.compile_scan(scan, args, f"--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir {tmp_path}")
    except Exception:
        if not (list(tmp_path.glob("*.ptx")) and list(tmp_path.glob("*.cubin"))):
            raise
    ptx = "".join(p.read_text(errors="replace") for p in tmp_path.glob("*.ptx"))
    assert ".target sm_90a" in ptx
    mma = ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
    # strips: C fragments · S0 hi and lo (8 p-tiles × 8 k-steps × 2, twice), one block body (16 + 8);
    # the final state: one k-step body (8 tiles × 2)
    assert mma == 2 * (8 * 8 * 2 + 16 + 8) + 8 * 2
