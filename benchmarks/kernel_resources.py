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
import os
import re
import subprocess
import tempfile

os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="zonos-kernel-resources-"))  # before triton

import torch  # noqa: E402
import triton  # noqa: E402
from gpu import report  # noqa: E402

from zonos_accel.triton import gemv, mamba_block, ssd_scan  # noqa: E402
from zonos_accel.triton._support import compile_for  # noqa: E402

REGISTERS_PER_SM = 65536


def resources(kernel, types: dict, constexprs: dict, num_warps: int, arch: int) -> dict:
    """Compile ``kernel`` (:func:`compile_for`, PDL on); ptxas's registers a thread, stack bytes (spills) and the
    kernel's shared memory."""
    compiled = compile_for(kernel, types, {**constexprs, "GDC": True}, num_warps, arch)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    regs = int(re.search(r"REG:(\d+)", out).group(1))
    stack = int(re.search(r"STACK:(\d+)", out).group(1))
    return {"regs": regs, "stack": stack, "shared": compiled.metadata.shared, "warps": num_warps}


def row(name: str, r: dict) -> list:
    per_sm = REGISTERS_PER_SM // (r["regs"] * 32 * r["warps"])
    return [name, r["warps"], r["regs"], r["stack"], r["shared"], per_sm]


def gemv_rows(arch, tiles, warps) -> list[list]:
    bf16 = {n: "*bf16" for n in ("x_ptr", "r_ptr", "nw_ptr", "nb_ptr", "w_ptr", "bias_ptr", "out_ptr", "sum_ptr",
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
                        types = {**bf16, "stats_ptr": "*fp32", "eps": "fp32"}
                        if prologue == gemv.GATED_RMS:
                            types["x_ptr"] = "*fp32"
                        norm = prologue == gemv.LAYER_NORM
                        constexprs = gemv.gemv_constexprs(
                            m, k, prologue, epilogue, torch.bfloat16, residual=norm, norm_bias=norm,
                            programs=64 if prologue == gemv.GATED_RMS else 1, kc=4, conv_bias=epilogue == gemv.CONV,
                        )  # fmt: skip
                        r = resources(gemv._gemv_kernel, types, constexprs, w, arch)
                        rows.append(row(f"GEMV {name}, {m} rows, tile {elements}", r))
    finally:
        gemv.TILE_ELEMENTS = saved
    return rows


def mamba_rows(arch) -> list[list]:
    types = {"zx_ptr": "*bf16", "ssm_ptr": "*bf16", "A_ptr": "*fp32", "D_ptr": "*bf16", "dt_bias_ptr": "*bf16",
             "gated_ptr": "*fp32", "stats_ptr": "*fp32"}  # fmt: skip
    constexprs = mamba_block.ssm_gate_constexprs(64, 128, 256, torch.bfloat16)
    rows = [row("Mamba2 state update + gate",
                resources(mamba_block._ssm_gate_kernel, types, constexprs, mamba_block.STATE_WARPS, arch))]  # fmt: skip
    types = {n: "*bf16" for n in ("x_ptr", "r_ptr", "nw_ptr", "nb_ptr", "w_ptr", "zx_ptr", "sum_ptr", "conv_ptr",
                                   "cw_ptr", "cb_ptr", "ssm_ptr", "D_ptr", "dt_bias_ptr")}  # fmt: skip
    types.update(A_ptr="*fp32", gated_ptr="*fp32", stats_ptr="*fp32", count_ptr="*i32", eps="fp32")
    for m in (2, 16):
        constexprs = mamba_block.in_proj_ssm_constexprs(m, 2048, 64, 64, 128, 1, 4, torch.bfloat16)
        r = resources(mamba_block._in_proj_ssm_kernel, types, constexprs, gemv.NUM_WARPS, arch)
        rows.append(row(f"Mamba2 in_proj with the state update (SSM_IN_PROJ), {m} rows", r))
    return rows


def scan_rows(arch) -> list[list]:
    types = {name: "*bf16" for name in ("x_ptr", "B_ptr", "C_ptr", "y_ptr", "init_ptr")}
    types.update({name: "*fp32" for name in ("dt_ptr", "A_ptr", "D_ptr", "states_ptr", "decay_ptr", "entering_ptr",
                                             "final_ptr")})  # fmt: skip
    bp, bn = ssd_scan.state_blocks(64, 128)
    blocks = dict(BLOCK_P=bp, BLOCK_N=bn)
    r = resources(ssd_scan._chunk_state_kernel, types, dict(Q=ssd_scan.CHUNK, **blocks), ssd_scan.NUM_WARPS, arch)
    rows = [row("SSD scan: chunk states", r)]
    constexprs = dict(HAS_INIT=True, ROWS=ssd_scan.STATE_ROWS, **blocks)
    r = resources(ssd_scan._state_passing_kernel, types, constexprs, ssd_scan.NUM_WARPS, arch)
    rows.append(row("SSD scan: state passing", r))
    for fp32 in (False, True):
        chunk_types = {k: "*fp32" if fp32 and v == "*bf16" else v for k, v in types.items()}
        constexprs = dict(HAS_D=True, Q=ssd_scan.CHUNK, STATE_PIECE=min(ssd_scan.STATE_PIECE, bn), FP32=fp32, **blocks)
        r = resources(ssd_scan._chunk_scan_kernel, chunk_types, constexprs, ssd_scan.SCAN_WARPS, arch)
        rows.append(row(f"SSD scan: chunk scan, {'fp32' if fp32 else 'bf16'}", r))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability to compile for (90: Hopper)")
    ap.add_argument("--tiles", default=str(gemv.TILE_ELEMENTS), help="comma-separated gemv.TILE_ELEMENTS values")
    ap.add_argument("--warps", default=str(gemv.NUM_WARPS), help="comma-separated GEMV warp counts")
    args = ap.parse_args()
    tiles = [int(v) for v in args.tiles.split(",")]
    warps = [int(v) for v in args.warps.split(",")]
    header = ["kernel", "warps", "registers", "stack B (spills)", "shared B", "programs / SM (registers)"]
    rows = gemv_rows(args.arch, tiles, warps) + mamba_rows(args.arch) + scan_rows(args.arch)
    print(report(f"Triton {triton.__version__}, sm_{args.arch}, compiled without a GPU", header, rows))


if __name__ == "__main__":
    main()
