"""Our decode and scan Triton kernels compile for Hopper (sm_90) on any machine: Triton compiles for a named target
without a GPU, so the CPU suite catches what Triton's interpreter does not check (types, globals a kernel may not
read, layouts the backend cannot lower). Each kernel compiles with the constexprs its launcher computes for the
Zonos-v0.1-hybrid shapes. Registers and spills of the same compiles: benchmarks/kernel_resources.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from zonos_accel.triton import gemv, mamba_block, ssd_scan  # noqa: E402
from zonos_accel.triton._support import compile_for  # noqa: E402

BF16_GEMV = ("x_ptr", "r_ptr", "nw_ptr", "nb_ptr", "w_ptr", "bias_ptr", "out_ptr", "sum_ptr", "conv_ptr", "cw_ptr",
             "cb_ptr")  # fmt: skip


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    from triton import knobs

    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path))


def _compile(kernel, types, constexprs, num_warps):
    assert compile_for(kernel, types, {**constexprs, "GDC": True}, num_warps).asm["cubin"]  # ptxas made a binary


@pytest.mark.parametrize("rows", [2, 16])
@pytest.mark.parametrize(
    "k,prologue,epilogue",
    [
        (2048, gemv.LAYER_NORM, gemv.CONV),  # Mamba2 in_proj
        (4096, gemv.GATED_RMS, gemv.NONE),  # Mamba2 out_proj
        (2048, gemv.LAYER_NORM, gemv.NONE),  # attention qkv
        (2048, gemv.LAYER_NORM, gemv.GLU),  # fc1
        (8192, gemv.NONE, gemv.NONE),  # fc2
    ],
)
def test_fused_gemv_compiles(rows, k, prologue, epilogue):
    types = {**{n: "*bf16" for n in BF16_GEMV}, "stats_ptr": "*fp32", "eps": "fp32"}
    if prologue == gemv.GATED_RMS:
        types["x_ptr"] = "*fp32"
    norm = prologue == gemv.LAYER_NORM
    constexprs = gemv.gemv_constexprs(
        rows, k, prologue, epilogue, torch.bfloat16, residual=norm, norm_bias=norm,
        programs=64 if prologue == gemv.GATED_RMS else 1, kc=4, conv_bias=epilogue == gemv.CONV,
    )  # fmt: skip
    _compile(gemv._gemv_kernel, types, constexprs, gemv.NUM_WARPS)


def test_mamba_block_kernels_compile():
    types = {"zx_ptr": "*bf16", "ssm_ptr": "*bf16", "A_ptr": "*fp32", "D_ptr": "*bf16", "dt_bias_ptr": "*bf16",
             "gated_ptr": "*fp32", "stats_ptr": "*fp32"}  # fmt: skip
    _compile(mamba_block._ssm_gate_kernel, types, mamba_block.ssm_gate_constexprs(64, 128, 256, torch.bfloat16),
             mamba_block.STATE_WARPS)  # fmt: skip
    types = {n: "*bf16" for n in ("x_ptr", "r_ptr", "nw_ptr", "nb_ptr", "w_ptr", "zx_ptr", "sum_ptr", "conv_ptr",
                                   "cw_ptr", "cb_ptr", "ssm_ptr", "D_ptr", "dt_bias_ptr")}  # fmt: skip
    types.update(A_ptr="*fp32", gated_ptr="*fp32", stats_ptr="*fp32", count_ptr="*i32", eps="fp32")
    constexprs = mamba_block.in_proj_ssm_constexprs(2, 2048, 64, 64, 128, 1, 4, torch.bfloat16)
    _compile(mamba_block._in_proj_ssm_kernel, types, constexprs, gemv.NUM_WARPS)


@pytest.mark.parametrize("fp32", [False, True])
def test_ssd_scan_kernels_compile(fp32):
    act = "*fp32" if fp32 else "*bf16"
    types = {n: act for n in ("x_ptr", "B_ptr", "C_ptr", "y_ptr", "init_ptr")}
    types.update({n: "*fp32" for n in ("dt_ptr", "A_ptr", "D_ptr", "states_ptr", "decay_ptr", "entering_ptr",
                                       "final_ptr")})  # fmt: skip
    bp, bn = ssd_scan.state_blocks(64, 128)
    blocks = dict(BLOCK_P=bp, BLOCK_N=bn)
    _compile(ssd_scan._chunk_state_kernel, types, dict(Q=ssd_scan.CHUNK, **blocks), ssd_scan.NUM_WARPS)
    _compile(ssd_scan._state_passing_kernel, types, dict(HAS_INIT=True, ROWS=ssd_scan.STATE_ROWS, **blocks),
             ssd_scan.NUM_WARPS)  # fmt: skip
    constexprs = dict(HAS_D=True, Q=ssd_scan.CHUNK, STATE_PIECE=min(ssd_scan.STATE_PIECE, bn), FP32=fp32, **blocks)
    _compile(ssd_scan._chunk_scan_kernel, types, constexprs, ssd_scan.SCAN_WARPS)
