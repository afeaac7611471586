"""Work split of the skinny GEMV (:mod:`zonos_accel.gemv.kernel`): the tuning table, in one place.

Pure Python (no CuTeDSL import), so the CPU tests can check every split covers its problem.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

VEC = 8  # 16-bit elements per 128-bit load
WARP = 32
NUM_SMS = 132  # H200 SXM


@dataclass(frozen=True)
class GemvConfig:
    """How one (M, N, K) problem is split over lanes, warps and CTAs.

    - a lane loads ``vecs`` 128-bit vectors of each of its warp's ``rows`` weight rows per warp-chunk
      (``32 * vecs`` vectors of a row, contiguous), and the matching vectors of every x row;
    - a CTA has ``warps_k`` warps side by side along K (same rows, consecutive chunks) times ``warps_n``
      groups of them on different rows: ``rows * warps_n`` rows per CTA;
    - ``splits`` CTAs along grid y share a row block's chunks (split-K); each writes fp32 partials and a
      second kernel sums them in a fixed order (deterministic);
    - ``hoist_loads``: a CTA barrier after each iteration's weight loads, which no load crosses, so all of
      them are in flight before the first FMA (without it, ptxas interleaves loads and FMAs to save
      registers, and a warp waits on DRAM several times in a row; with it, more registers per thread);
    - ``stream_loads``: weight loads as ``ld.global.nc.L1::no_allocate.L2::256B`` (read-only, no L1
      allocation, 256-byte L2 prefetch) instead of plain ``ld.global``;
    - ``pdl``: programmatic dependent launch. The kernel may start while the previous kernel on the stream
      drains: it issues its first weight loads (weights are never written during a decode step), then
      waits for the previous grid (``griddepcontrol.wait``) before reading x or writing anything, and lets
      the next kernel launch once all its CTAs have issued their loads. Hides the launch gap and tail
      between consecutive kernels, inside CUDA graphs too.
    """

    vecs: int
    rows: int
    warps_k: int
    warps_n: int
    splits: int = 1
    hoist_loads: bool = True
    # gemv_config turns it on except where TUNED says otherwise: with the (4, 2) tile at M = 2 faster on 6 of
    # the 7 Zonos shapes (in_proj 10.25 vs 10.72 µs, qkv 4.61 vs 5.38); H200, benchmarks/gemv.py, 2026-11-30.
    stream_loads: bool = False
    # On by default: the whole-step projections at M = 2 take 0.899 ms with it against 1.045 ms without
    # (cuBLAS 1.245 ms); H200, benchmarks/gemv.py, 2026-11-30.
    pdl: bool = True

    @property
    def threads(self) -> int:
        return WARP * self.warps_k * self.warps_n

    # The kernel's index map, in plain arithmetic so the same code runs on the device's Int32 values and on
    # the CPU tests' tensors (which check that every weight vector is read exactly once).

    def first_row(self, block_n, group):
        """First weight row of row group ``group`` (0..warps_n-1) in CTA ``block_n``."""
        return (block_n * self.warps_n + group) * self.rows

    def kvec(self, it, split, warp_k, lane, v):
        """The 128-bit vector (index along K / 8) a lane loads for iteration ``it`` and vector ``v``."""
        return ((it * self.splits + split) * self.warps_k + warp_k) * (WARP * self.vecs) + v * WARP + lane

    def iters(self, k: int) -> int:
        """Warp-chunks each warp walks (the kernel unrolls them)."""
        return cdiv(cdiv(k // VEC, WARP * self.vecs), self.warps_k * self.splits)

    def row_blocks(self, n: int) -> int:
        return cdiv(n, self.rows_per_cta)

    def k_exact(self, k: int) -> bool:
        """Every vector index the lanes reach is inside K (no predicate on the loads)."""
        return self.iters(k) * self.splits * self.warps_k * WARP * self.vecs == k // VEC

    def n_exact(self, n: int) -> bool:
        """Every row the warps reach is inside N (no clamp, no store predicate)."""
        return n % self.rows_per_cta == 0

    @property
    def rows_per_cta(self) -> int:
        return self.rows * self.warps_n

    def check(self, m: int, n: int, k: int) -> None:
        """Raise ValueError if this split cannot compute x (m, k) · W (n, k)ᵀ."""
        if k % VEC:
            raise ValueError(f"K = {k} must be a multiple of {VEC} (rows are read as 128-bit vectors)")
        if min(self.vecs, self.rows, self.warps_k, self.warps_n, self.splits, m, n, k) < 1:
            raise ValueError(f"{self} for M={m}, N={n}, K={k}: every size must be positive")
        if self.threads > 1024:
            raise ValueError(f"{self}: {self.threads} threads per CTA exceed 1024")
        if self.warps_k > 1 and m * self.rows * self.warps_n > self.threads:
            raise ValueError(
                f"{self}: {m * self.rows * self.warps_n} partial sums (M * rows * warps_n) exceed the threads"
            )
        per_warp = cdiv(cdiv(k // VEC, WARP * self.vecs), self.warps_k)
        if self.splits > per_warp:
            raise ValueError(f"{self}: {self.splits} splits for {per_warp} chunks per warp")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# (vecs, rows) per lane by the number M of x rows. A lane holds rows * vecs weight vectors (8 = 128 B in
# flight per lane) and M * vecs x vectors; its x vectors serve each of its rows, its weight vectors each
# of the M rows of x. First guess from register budgets (56-80 registers at M <= 4 and K <= 4096, so 6-8
# CTAs of 128 threads fit an SM); benchmarks/gemv.py sweeps the alternatives on the H200 and prints which won.
LANE_TILES = {1: (8, 1), 2: (2, 4), 3: (2, 4), 4: (2, 4)}
MIN_WARPS_PER_CTA = 4
MAX_WARPS_K = 4
MIN_CTAS = 2 * NUM_SMS  # fewer row blocks than this: split K across CTAs
# The largest M routed to the kernel (prefill stays on cuBLAS). At M = 8 and 16 cuBLAS wins (in_proj 0.71x
# and 0.39x; H200, benchmarks/gemv.py, 2026-11-30); decode runs M = 2 (batch 1 with CFG).
MAX_ROWS = 4
# Problems within MAX_ROWS where cuBLAS is faster, so they stay on it: at M = 4 (batch 2 with CFG) in_proj 12.73
# vs 11.86 µs, fc1 21.77 vs 19.25, heads 13.59 vs 13.52 (H200, benchmarks/gemv.py, 2026-11-30).
CUBLAS_FASTER = {(4, 8512, 2048), (4, 16384, 2048), (4, 9232, 2048)}


def lane_tile(m: int) -> tuple[int, int]:
    if m in LANE_TILES:
        return LANE_TILES[m]
    return (1, 4) if m <= 8 else (1, 2)


# Pinned splits (M, N, K) → (vecs, rows, stream_loads): the fastest of every candidate split in
# `benchmarks/gemv.py --sweep-m 1,2,4` (H200, 2026-11-30; µs per call, cold weights, graph replay). M = 2 is the
# decode step (batch 1 with CFG); M = 1 and 4 are batch 1 without CFG and batch 2 with it.  Streaming loads help
# the K = 2048 shapes with many rows and hurt the (2, 4) tile at K ≥ 4096 at M = 2 (out_proj 6.78 vs 5.14 µs).
TUNED = {
    (1, 8512, 2048): (1, 8, False),  # Mamba2 in_proj: 9.38 (cuBLAS 11.81)
    (1, 2048, 4096): (2, 4, False),  # Mamba2 out_proj: 5.07 (9.31)
    (1, 3072, 2048): (1, 8, False),  # attention qkv: 4.15 (6.49)
    (1, 2048, 2048): (8, 1, False),  # attention out: 3.45 (6.08)
    (1, 16384, 2048): (2, 4, False),  # MLP fc1: 17.24 (19.34)
    (1, 2048, 8192): (4, 2, False),  # MLP fc2: 9.61 (13.56)
    (1, 9232, 2048): (1, 8, False),  # the 9 heads, stacked and padded: 10.00 (12.33)
    (2, 8512, 2048): (2, 4, True),  # Mamba2 in_proj: 10.27
    (2, 2048, 4096): (2, 4, False),  # Mamba2 out_proj: 5.14
    (2, 3072, 2048): (1, 8, False),  # attention qkv: 4.28
    (2, 2048, 2048): (2, 4, False),  # attention out: 3.59
    (2, 16384, 2048): (4, 2, True),  # MLP fc1: 17.93
    (2, 2048, 8192): (2, 4, False),  # MLP fc2: 9.35
    (2, 9232, 2048): (4, 2, True),  # the 9 heads: 10.79
    (4, 2048, 4096): (2, 4, True),  # Mamba2 out_proj: 6.65 (9.27)
    (4, 3072, 2048): (1, 8, False),  # attention qkv: 5.00 (6.51)
    (4, 2048, 2048): (2, 4, True),  # attention out: 4.12 (6.09)
    (4, 2048, 8192): (2, 4, True),  # MLP fc2: 10.57 (13.46)
}


def gemv_config(m: int, n: int, k: int, vecs: int | None = None, rows: int | None = None) -> GemvConfig:
    """The work split for x (m, k) · W (n, k)ᵀ: the :data:`TUNED` entry, else the lane tile of :data:`LANE_TILES`
    (``vecs``/``rows`` override either)."""
    stream_loads = True
    if vecs is None and rows is None and (m, n, k) in TUNED:
        vecs, rows, stream_loads = TUNED[(m, n, k)]
    tile = lane_tile(m)
    vecs, rows = vecs or tile[0], rows or tile[1]
    chunks = cdiv(k // VEC, WARP * vecs)
    warps_k = min(chunks, MAX_WARPS_K)
    warps_n = max(1, MIN_WARPS_PER_CTA // warps_k)
    row_blocks = cdiv(n, rows * warps_n)
    per_warp = cdiv(chunks, warps_k)
    splits = 1
    if row_blocks < MIN_CTAS and per_warp > 1:
        splits = min(per_warp, cdiv(MIN_CTAS, row_blocks))
        splits = cdiv(per_warp, cdiv(per_warp, splits))  # no split left without a chunk
    return GemvConfig(vecs=vecs, rows=rows, warps_k=warps_k, warps_n=warps_n, splits=splits, stream_loads=stream_loads)


def candidate_configs(m: int, n: int, k: int) -> list[GemvConfig]:
    """The default split first, then the alternatives ``benchmarks/gemv.py`` times against it: lane tiles of 8
    and 16 weight vectors with plain and streaming loads, and the default with interleaved loads, with two
    splits and without programmatic dependent launch."""
    base = gemv_config(m, n, k)
    out = [base]
    # 8 weight vectors (128 B) in flight per lane, then 16 (256 B: more bytes per thread, fewer CTAs per SM).
    for vecs, rows in ((8, 1), (4, 2), (2, 4), (1, 8), (8, 2), (4, 4), (2, 8)):
        for stream_loads in (True, False):
            out.append(replace(gemv_config(m, n, k, vecs=vecs, rows=rows), stream_loads=stream_loads))
    out.append(replace(base, hoist_loads=False))
    if base.splits == 1 and cdiv(cdiv(k // VEC, WARP * base.vecs), base.warps_k) > 1:
        out.append(replace(base, splits=2))
    out.append(replace(base, pdl=False))
    unique = []
    for c in out:
        try:
            c.check(m, n, k)
        except ValueError:
            continue
        if c not in unique:
            unique.append(c)
    return unique
