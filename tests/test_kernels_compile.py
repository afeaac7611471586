"""Our decode and scan Triton kernels compile for Hopper (sm_90) on any machine: Triton compiles for a named target
without a GPU, so the CPU suite catches what Triton's interpreter does not check (types, globals a kernel may not
read, layouts the backend cannot lower). Registers and spills of the same compiles: benchmarks/kernel_resources.py."""

from __future__ import annotations

import inspect

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from zonos_accel.triton import gemv, mamba_block, ssd_scan  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
BF16_GEMV = ("x_ptr", "r_ptr", "nw_ptr", "nb_ptr", "w_ptr", "bias_ptr", "out_ptr", "sum_ptr", "conv_ptr", "cw_ptr",
             "cb_ptr")  # fmt: skip


def _compile(fn, types: dict, constexprs: dict, num_warps: int):
    names = inspect.signature(fn.fn).parameters
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    kernel = triton.compile(ASTSource(fn, signature, constexprs), target=HOPPER, options={"num_warps": num_warps})
    assert kernel.asm["cubin"]  # ptxas produced a binary


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
def test_fused_gemv_compiles(rows, k, prologue, epilogue, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    types = {**{n: "*bf16" for n in BF16_GEMV}, "stats_ptr": "*fp32", "eps": "fp32"}
    if prologue == gemv.GATED_RMS:
        types["x_ptr"] = "*fp32"
    rms = prologue == gemv.GATED_RMS
    constexprs = dict(
        M=rows, BLOCK_N=gemv.block_n(k, epilogue == gemv.GLU), BLOCK_K=triton.next_power_of_2(k), PROLOGUE=prologue,
        EPILOGUE=epilogue, HAS_RESIDUAL=prologue == gemv.LAYER_NORM, HAS_NORM_BIAS=prologue == gemv.LAYER_NORM,
        HAS_BIAS=False, GROUPS=1, PROGRAMS=64 if rms else 1, PROGRAMS_P2=64 if rms else 1, KC=4, KCP=4,
        HAS_CONV_BIAS=epilogue == gemv.CONV, ACC=tl.float32, GDC=True,
    )  # fmt: skip
    _compile(gemv._gemv_kernel, types, constexprs, gemv.NUM_WARPS)


def test_mamba_block_kernels_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    types = {"zx_ptr": "*bf16", "ssm_ptr": "*bf16", "A_ptr": "*fp32", "D_ptr": "*bf16", "dt_bias_ptr": "*bf16",
             "gated_ptr": "*fp32", "stats_ptr": "*fp32"}  # fmt: skip
    constexprs = dict(BLOCK_P=mamba_block.BLOCK_P, BLOCK_S=128, PROGRAMS=256, ACC=tl.float32, GDC=True)
    _compile(mamba_block._ssm_gate_kernel, types, constexprs, mamba_block.STATE_WARPS)
    types = {n: "*bf16" for n in ("x_ptr", "r_ptr", "nw_ptr", "nb_ptr", "w_ptr", "zx_ptr", "sum_ptr", "conv_ptr",
                                   "cw_ptr", "cb_ptr", "ssm_ptr", "D_ptr", "dt_bias_ptr")}  # fmt: skip
    types.update(A_ptr="*fp32", gated_ptr="*fp32", stats_ptr="*fp32", count_ptr="*i32", eps="fp32")
    tile = gemv.block_n(2048)
    constexprs = dict(
        M=2, BLOCK_N=tile, BLOCK_K=2048, HAS_RESIDUAL=True, HAS_NORM_BIAS=True, KC=4, KCP=4, HAS_CONV_BIAS=True,
        BC_TILES=256 // tile, SHARED_TILES=256 // tile + 64 // tile, HEAD_TILES=128 // tile,
        TARGET=256 // tile + 1 + 128 // tile, SSM_P=mamba_block.BLOCK_P, BLOCK_S=128, ACC=tl.float32, GDC=True,
    )  # fmt: skip
    _compile(mamba_block._in_proj_ssm_kernel, types, constexprs, gemv.NUM_WARPS)


@pytest.mark.parametrize("fp32", [False, True])
def test_ssd_scan_kernels_compile(fp32, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    act = "*fp32" if fp32 else "*bf16"
    types = {n: act for n in ("x_ptr", "B_ptr", "C_ptr", "y_ptr", "init_ptr")}
    types.update({n: "*fp32" for n in ("dt_ptr", "A_ptr", "D_ptr", "states_ptr", "decay_ptr", "entering_ptr",
                                       "final_ptr")})  # fmt: skip
    q, bp, bn = ssd_scan.CHUNK, 64, 128
    _compile(ssd_scan._chunk_state_kernel, types, dict(Q=q, BLOCK_P=bp, BLOCK_N=bn, GDC=True), ssd_scan.NUM_WARPS)
    constexprs = dict(HAS_INIT=True, ROWS=ssd_scan.STATE_ROWS, BLOCK_P=bp, BLOCK_N=bn, GDC=True)
    _compile(ssd_scan._state_passing_kernel, types, constexprs, ssd_scan.NUM_WARPS)
    constexprs = dict(HAS_D=True, Q=q, BLOCK_P=bp, BLOCK_N=bn, STATE_PIECE=ssd_scan.STATE_PIECE, FP32=fp32, GDC=True)
    _compile(ssd_scan._chunk_scan_kernel, types, constexprs, ssd_scan.SCAN_WARPS)
