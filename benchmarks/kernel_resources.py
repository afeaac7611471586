"""Registers, spills and shared memory of our decode and scan Triton kernels at Zonos-v0.1-hybrid shapes, compiled
for a GPU architecture on any machine (no GPU needed: Triton compiles for a named target, and its bundled cuobjdump
reads ptxas's resource use from the cubin).

What it answers before a GPU run: does a tile or warp count fit a program in registers (a spill is local memory
traffic on the kernel's path), and how many programs fit an SM (65536 registers; 255 a thread at most)? Rows: the
fused GEMVs (zonos_accel/triton/gemv.py) of each projection at 2 and 16 rows, the Mamba2 block's state-update kernels
(zonos_accel/triton/mamba_block.py), and the SSD scan's three kernels (zonos_accel/triton/ssd_scan.py).

    python3 benchmarks/kernel_resources.py [--arch 90] [--tiles 8192,16384] [--warps 4,8]
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import tempfile

os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="zonos-kernel-resources-"))  # before triton

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from gpu import report  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from zonos_accel.triton import gemv, mamba_block, ssd_scan  # noqa: E402

REGISTERS_PER_SM = 65536


def resources(fn, types: dict, constexprs: dict, num_warps: int, target: GPUTarget) -> dict:
    """Compile ``fn`` (a JITFunction) with pointer / scalar ``types`` (default i32) and ``constexprs``; ptxas's
    registers a thread, stack bytes (spills) and the kernel's shared memory."""
    names = inspect.signature(fn.fn).parameters
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    kernel = triton.compile(ASTSource(fn, signature, constexprs), target=target, options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    regs = int(re.search(r"REG:(\d+)", out).group(1))
    stack = int(re.search(r"STACK:(\d+)", out).group(1))
    return {"regs": regs, "stack": stack, "shared": kernel.metadata.shared, "warps": num_warps}


def row(name: str, r: dict) -> list:
    per_sm = REGISTERS_PER_SM // (r["regs"] * 32 * r["warps"])
    return [name, r["warps"], r["regs"], r["stack"], r["shared"], per_sm]


def ptr(dtype: str) -> str:
    return f"*{dtype}"


def gemv_rows(target, tiles, warps) -> list[list]:
    bf16 = {n: ptr("bf16") for n in ("x_ptr", "r_ptr", "nw_ptr", "nb_ptr", "w_ptr", "bias_ptr", "out_ptr", "sum_ptr",
                                       "conv_ptr", "cw_ptr", "cb_ptr")}  # fmt: skip
    problems = [("in_proj + LayerNorm + conv", 2048, gemv.LAYER_NORM, gemv.CONV),
                ("out_proj + gated RMSNorm", 4096, gemv.GATED_RMS, gemv.NONE),
                ("qkv + LayerNorm", 2048, gemv.LAYER_NORM, gemv.NONE),
                ("fc1 + LayerNorm + GLU", 2048, gemv.LAYER_NORM, gemv.GLU),
                ("fc2", 8192, gemv.NONE, gemv.NONE)]  # fmt: skip
    rows = []
    saved = gemv.TILE_ELEMENTS
    try:
        for elements in tiles:
            gemv.TILE_ELEMENTS = elements
            for w in warps:
                for m in (2, 16):
                    for name, k, prologue, epilogue in problems:
                        types = {**bf16, "stats_ptr": ptr("fp32"), "eps": "fp32"}
                        if prologue == gemv.GATED_RMS:
                            types["x_ptr"] = ptr("fp32")
                        rms = prologue == gemv.GATED_RMS
                        constexprs = dict(
                            M=m, BLOCK_N=gemv.block_n(k, epilogue == gemv.GLU), BLOCK_K=triton.next_power_of_2(k),
                            PROLOGUE=prologue, EPILOGUE=epilogue, HAS_RESIDUAL=prologue == gemv.LAYER_NORM,
                            HAS_NORM_BIAS=prologue == gemv.LAYER_NORM, HAS_BIAS=False, GROUPS=1,
                            PROGRAMS=64 if rms else 1, PROGRAMS_P2=64 if rms else 1, KC=4, KCP=4,
                            HAS_CONV_BIAS=epilogue == gemv.CONV, ACC=tl.float32, GDC=True,
                        )  # fmt: skip
                        r = resources(gemv._gemv_kernel, types, constexprs, w, target)
                        rows.append(row(f"GEMV {name}, {m} rows, tile {elements}", r))
    finally:
        gemv.TILE_ELEMENTS = saved
    return rows


def mamba_rows(target) -> list[list]:
    rows = []
    types = {"zx_ptr": ptr("bf16"), "ssm_ptr": ptr("bf16"), "A_ptr": ptr("fp32"), "D_ptr": ptr("bf16"),
             "dt_bias_ptr": ptr("bf16"), "gated_ptr": ptr("fp32"), "stats_ptr": ptr("fp32")}  # fmt: skip
    constexprs = dict(BLOCK_P=mamba_block.BLOCK_P, BLOCK_S=128, PROGRAMS=256, ACC=tl.float32, GDC=True)
    r = resources(mamba_block._ssm_gate_kernel, types, constexprs, mamba_block.STATE_WARPS, target)
    rows.append(row("Mamba2 state update + gate", r))
    types = {n: ptr("bf16") for n in ("x_ptr", "r_ptr", "nw_ptr", "nb_ptr", "w_ptr", "zx_ptr", "sum_ptr", "conv_ptr",
                                        "cw_ptr", "cb_ptr", "ssm_ptr", "D_ptr", "dt_bias_ptr")}  # fmt: skip
    types.update(A_ptr=ptr("fp32"), gated_ptr=ptr("fp32"), stats_ptr=ptr("fp32"), count_ptr=ptr("i32"), eps="fp32")
    tile = gemv.block_n(2048)
    for m in (2, 16):
        constexprs = dict(
            M=m, BLOCK_N=tile, BLOCK_K=2048, HAS_RESIDUAL=True, HAS_NORM_BIAS=True, KC=4, KCP=4, HAS_CONV_BIAS=True,
            BC_TILES=256 // tile, SHARED_TILES=256 // tile + 64 // tile, HEAD_TILES=128 // tile,
            TARGET=256 // tile + 1 + 128 // tile, SSM_P=mamba_block.BLOCK_P, BLOCK_S=128, ACC=tl.float32, GDC=True,
        )  # fmt: skip
        r = resources(mamba_block._in_proj_ssm_kernel, types, constexprs, gemv.NUM_WARPS, target)
        rows.append(row(f"Mamba2 in_proj with the state update (SSM_IN_PROJ), {m} rows", r))
    return rows


def scan_rows(target) -> list[list]:
    types = {name: ptr("bf16") for name in ("x_ptr", "B_ptr", "C_ptr", "y_ptr", "init_ptr")}
    types.update({name: ptr("fp32") for name in ("dt_ptr", "A_ptr", "D_ptr", "states_ptr", "decay_ptr", "entering_ptr",
                                                 "final_ptr")})  # fmt: skip
    q, bp, bn = ssd_scan.CHUNK, 64, 128
    rows = []
    r = resources(ssd_scan._chunk_state_kernel, types, dict(Q=q, BLOCK_P=bp, BLOCK_N=bn, GDC=True),
                  ssd_scan.NUM_WARPS, target)  # fmt: skip
    rows.append(row("SSD scan: chunk states", r))
    constexprs = dict(HAS_INIT=True, ROWS=ssd_scan.STATE_ROWS, BLOCK_P=bp, BLOCK_N=bn, GDC=True)
    rows.append(row("SSD scan: state passing", resources(ssd_scan._state_passing_kernel, types, constexprs,
                                                         ssd_scan.NUM_WARPS, target)))  # fmt: skip
    for fp32 in (False, True):
        chunk_types = {k: ptr("fp32") if fp32 and v == ptr("bf16") else v for k, v in types.items()}
        constexprs = dict(HAS_D=True, Q=q, BLOCK_P=bp, BLOCK_N=bn, STATE_PIECE=ssd_scan.STATE_PIECE, FP32=fp32,
                          GDC=True)  # fmt: skip
        r = resources(ssd_scan._chunk_scan_kernel, chunk_types, constexprs, ssd_scan.SCAN_WARPS, target)
        rows.append(row(f"SSD scan: chunk scan, {'fp32' if fp32 else 'bf16'}", r))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability to compile for (90: Hopper)")
    ap.add_argument("--tiles", default=str(gemv.TILE_ELEMENTS), help="comma-separated gemv.TILE_ELEMENTS values")
    ap.add_argument("--warps", default=str(gemv.NUM_WARPS), help="comma-separated GEMV warp counts")
    args = ap.parse_args()
    target = GPUTarget("cuda", args.arch, 32)
    tiles = [int(v) for v in args.tiles.split(",")]
    warps = [int(v) for v in args.warps.split(",")]
    header = ["kernel", "warps", "registers", "stack B (spills)", "shared B", "programs / SM (registers)"]
    rows = gemv_rows(target, tiles, warps) + mamba_rows(target) + scan_rows(target)
    print(report(f"Triton {triton.__version__}, sm_{args.arch}, compiled without a GPU", header, rows))


if __name__ == "__main__":
    main()
