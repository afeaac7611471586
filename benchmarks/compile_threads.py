"""How much faster do Triton compiles finish on threads (what the warm-up's compile-ahead pass relies on,
``zonos_accel/compile_ahead.py``), and on processes, which share no interpreter lock?

Compiles ``--kernels`` distinct specializations of one elementwise kernel (a different constexpr each, so none is a
cache hit) into an empty Triton cache, for Hopper (sm_90) by default, on each thread count of ``--threads``, and
prints the wall time against one thread; each count of ``--processes`` compiles them on a pool of forked worker
processes instead (started and warmed up before the clock starts; their start is a column of its own). Needs no
GPU: Triton compiles for a named target without one.

    python3 benchmarks/compile_threads.py [--kernels 32] [--threads 1 4 8 16] [--processes 8 16]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="zonos-compile-threads-")  # before triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402


@triton.jit
def _work(x_ptr, y_ptr, n, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(8):
        acc += tl.exp(x * SCALE + i) * tl.sin(x)
    tl.store(y_ptr + offs, acc.to(tl.bfloat16), mask=mask)


def compile_one(target: GPUTarget, scale: float) -> float:
    signature = {"x_ptr": "*bf16", "y_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr", "SCALE": "constexpr"}
    t0 = time.perf_counter()
    triton.compile(ASTSource(_work, signature, {"BLOCK": 1024, "SCALE": scale}), target=target)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=32, help="distinct specializations compiled per thread count")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--processes", type=int, nargs="*", default=[], help="worker process counts to time as well")
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability to compile for (90: Hopper)")
    args = ap.parse_args()
    target = GPUTarget("cuda", args.arch, 32)
    compile_one(target, -1.0)  # first-use costs (imports, the compiler's setup) out of the timings
    rows, first = [], 0
    for threads in args.threads:
        scales = [float(first + i) + 0.5 for i in range(args.kernels)]  # new specializations: no cache hits
        first += args.kernels
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            each = list(pool.map(lambda s: compile_one(target, s), scales))
        wall = time.perf_counter() - t0
        rows.append((f"{threads} threads", "", wall, sum(each)))
    for processes in args.processes:
        scales = [float(first + i) + 0.5 for i in range(args.kernels)]
        first += args.kernels + processes
        t0 = time.perf_counter()
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
            list(pool.map(compile_one, [target] * processes, [float(first - 1 - i) + 0.5 for i in range(processes)]))
            start = time.perf_counter() - t0
            t0 = time.perf_counter()
            each = list(pool.map(compile_one, [target] * len(scales), scales))
            wall = time.perf_counter() - t0
        rows.append((f"{processes} processes", f"{start:.2f}", wall, sum(each)))
    print(f"\n### Triton compiles on threads and processes: {args.kernels} kernels for sm_{args.arch}, "
          f"triton {triton.__version__}, {os.cpu_count()} CPUs\n")  # fmt: skip
    print("| workers | pool start + one compile each s | wall s | sum of compile times s | speed-up vs the first row |")
    print("|---|---|---|---|---|")
    for workers, start, wall, total in rows:
        print(f"| {workers} | {start} | {wall:.2f} | {total:.2f} | {rows[0][2] / wall:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
