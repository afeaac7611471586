"""Work split of the skinny GEMV (:mod:`zonos_accel.gemv.kernel`): the tuning table, in one place.

Pure Python (no CuTeDSL import), so the CPU tests can check every split covers its problem.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

VEC = 8  # 16-bit elements per 128-bit load
WARP = 32
NUM_SMS = 132  # H200 SXM
MAX_THREADS_PER_SM = 2048

MMA_ROWS = 16  # weight rows per mma.m16n8k16 (its M)
MMA_COLS = 8  # x rows per mma (its N)
MMA_LANES_K = 4  # lanes side by side along K in the fragment: a k-step is 4 vectors = 32 elements (twice its K)


class _Grid:
    """The grid both kernels' splits share, from a split's ``rows`` (weight rows per warp) and ``chunk_vecs``
    (128-bit vectors of a row a warp covers per iteration): ``warps_k`` warps side by side along K times
    ``warps_n`` on different rows per CTA, and ``splits`` CTAs along grid y sharing a row block's chunks.

    The index map is plain arithmetic, so the same code runs on the device's Int32 values and on the CPU tests'
    tensors (which check that every weight vector is read exactly once).
    """

    @property
    def threads(self) -> int:
        return WARP * self.warps_k * self.warps_n

    @property
    def rows_per_cta(self) -> int:
        return self.rows * self.warps_n

    def first_row(self, block_n, group):
        """First weight row of row group ``group`` (0..warps_n-1) in CTA ``block_n``."""
        return (block_n * self.warps_n + group) * self.rows

    def chunk(self, it, split, warp_k):
        """The warp-chunk (along K, in units of ``chunk_vecs``) a warp walks at iteration ``it``."""
        return (it * self.splits + split) * self.warps_k + warp_k

    def iters(self, k: int) -> int:
        """Warp-chunks each warp walks (the kernels unroll them)."""
        return cdiv(cdiv(k // VEC, self.chunk_vecs), self.warps_k * self.splits)

    def row_blocks(self, n: int) -> int:
        return cdiv(n, self.rows_per_cta)

    def k_exact(self, k: int) -> bool:
        """Every vector index the lanes reach is inside K (no predicate on the loads)."""
        return self.iters(k) * self.splits * self.warps_k * self.chunk_vecs == k // VEC

    def n_exact(self, n: int) -> bool:
        """Every row the warps reach is inside N (no clamp, no store predicate)."""
        return n % self.rows_per_cta == 0

    def _check_grid(self, m: int, n: int, k: int, *sizes: int) -> None:
        if k % VEC:
            raise ValueError(f"K = {k} must be a multiple of {VEC} (rows are read as 128-bit vectors)")
        if min(*sizes, self.warps_k, self.warps_n, self.splits, m, n, k) < 1:
            raise ValueError(f"{self} for M={m}, N={n}, K={k}: every size must be positive")
        if self.threads > 1024:
            raise ValueError(f"{self}: {self.threads} threads per CTA exceed 1024")
        if self.min_ctas < 0 or self.min_ctas * self.threads > MAX_THREADS_PER_SM:
            raise ValueError(f"{self}: {self.min_ctas} CTAs of {self.threads} threads cannot share an SM")
        per_warp = cdiv(cdiv(k // VEC, self.chunk_vecs), self.warps_k)
        if self.splits > per_warp:
            raise ValueError(f"{self}: {self.splits} splits for {per_warp} chunks per warp")


@dataclass(frozen=True)
class FmaConfig(_Grid):
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
    - ``min_ctas``: CTAs per SM the compiler must fit (``.minnctapersm``: it caps registers per thread, spilling
      if it must); 0 leaves registers to the compiler.
    """

    vecs: int
    rows: int
    warps_k: int
    warps_n: int
    splits: int = 1
    hoist_loads: bool = True
    # fma_config turns it on unless told otherwise (TUNED does, where plain loads were faster). With the (4, 2)
    # tile at M = 2 it was faster on 6 of the 7 Zonos shapes (in_proj 10.25 vs 10.72 µs, qkv 4.61 vs 5.38); H200,
    # docs/BENCHMARKS.md, decisions: stream_loads.
    stream_loads: bool = False
    # On by default: the whole-step projections at M = 2 take 0.899 ms with it against 1.045 ms without
    # (cuBLAS 1.245 ms); H200, docs/BENCHMARKS.md, decisions: FmaConfig.pdl.
    pdl: bool = True
    min_ctas: int = 0

    @property
    def chunk_vecs(self) -> int:
        return WARP * self.vecs

    def kvec(self, it, split, warp_k, lane, v):
        """The 128-bit vector (index along K / 8) a lane loads for iteration ``it`` and vector ``v``."""
        return self.chunk(it, split, warp_k) * self.chunk_vecs + v * WARP + lane

    def check(self, m: int, n: int, k: int) -> None:
        """Raise ValueError if this split cannot compute x (m, k) · W (n, k)ᵀ."""
        self._check_grid(m, n, k, self.vecs, self.rows)
        if self.warps_k > 1 and m * self.rows * self.warps_n > self.threads:
            raise ValueError(
                f"{self}: {m * self.rows * self.warps_n} partial sums (M * rows * warps_n) exceed the threads"
            )


@dataclass(frozen=True)
class MmaConfig(_Grid):
    """Work split of the tensor-core GEMV (:class:`~zonos_accel.gemv.kernel.MmaGemv`), M ≤ 8.

    A warp computes ``tiles`` tiles of 16 weight rows × the M rows of x with ``mma.m16n8k16`` (the 8 columns
    are x's rows, zero past M). Per k-step of 32 elements, lane ``4 g + c`` loads one 128-bit vector of
    weight rows ``g`` and ``g + 8`` of each tile and the same vector of x row ``g``: elements
    ``8 c .. 8 c + 7`` of the step. The sum over K does not care which k sits in which slot of the MMA
    fragment, so the loaded registers are the fragments as they are, with no shuffles or conversions.
    A warp walks ``ksteps`` steps per iteration (all their loads issued before the first MMA); CTAs hold
    ``warps_k`` warps along K times ``warps_n`` along N, and ``splits`` CTAs share a row block's K as in
    :class:`FmaConfig`.

    ``half``: tiles of 8 weight rows, fed to both halves of the fragment (the second half's sums are
    discarded): twice the warps for the same rows, half the bytes per lane, where 16-row tiles leave too few
    CTAs without splitting K. ``min_ctas`` as in :class:`FmaConfig`.
    """

    tiles: int
    ksteps: int
    warps_k: int
    warps_n: int
    splits: int = 1
    half: bool = False
    hoist_loads: bool = True
    stream_loads: bool = True
    pdl: bool = True
    min_ctas: int = 0

    @property
    def tile_rows(self) -> int:
        return MMA_ROWS // 2 if self.half else MMA_ROWS

    @property
    def halves(self) -> int:
        """Row halves of a tile loaded per lane (rows g and g + 8, or row g only)."""
        return 1 if self.half else 2

    @property
    def rows(self) -> int:
        """Weight rows per warp."""
        return self.tile_rows * self.tiles

    @property
    def chunk_vecs(self) -> int:
        return MMA_LANES_K * self.ksteps

    def kvec(self, it, split, warp_k, c, step):
        """The vector (index along K / 8) that lanes with ``lane % 4 == c`` load at iteration ``it``, step ``step``."""
        return self.chunk(it, split, warp_k) * self.chunk_vecs + step * MMA_LANES_K + c

    def check(self, m: int, n: int, k: int) -> None:
        """Raise ValueError if this split cannot compute x (m, k) · W (n, k)ᵀ."""
        self._check_grid(m, n, k, self.tiles, self.ksteps)
        if m > MMA_COLS:
            raise ValueError(f"the tensor-core GEMV takes at most {MMA_COLS} rows of x, got M = {m}")


GemvConfig = FmaConfig | MmaConfig  # the two kernels' splits


# (vecs, rows) per lane by the number M of x rows. A lane holds rows * vecs weight vectors (8 = 128 B in
# flight per lane) and M * vecs x vectors; its x vectors serve each of its rows, its weight vectors each
# of the M rows of x. First guess from register budgets (56-80 registers at M <= 4 and K <= 4096, so 6-8
# CTAs of 128 threads fit an SM); benchmarks/gemv.py sweeps the alternatives on the H200 and prints which won.
LANE_TILES = {1: (8, 1), 2: (2, 4), 3: (2, 4), 4: (2, 4)}
MIN_WARPS_PER_CTA = 4
MAX_WARPS_K = 4
MIN_CTAS = 2 * NUM_SMS  # fewer row blocks than this: split K across CTAs
# The largest M routed to the kernels (prefill stays on cuBLAS): at M = 8 the tensor-core kernel beats cuBLAS on
# every Zonos shape (1.04-1.46x), at M = 16 (past its 8 columns) the FMA kernel loses (in_proj 0.38x); H200,
# docs/BENCHMARKS.md, decisions: MAX_ROWS. Decode runs M = 2 (batch 1 with CFG), batch 4 with CFG M = 8.
MAX_ROWS = MMA_COLS


def lane_tile(m: int) -> tuple[int, int]:
    if m in LANE_TILES:
        return LANE_TILES[m]
    return (1, 4) if m <= 8 else (1, 2)


# Pinned splits (M, N, K) → ("fma", vecs, rows, stream_loads[, max_warps_k]) or ("mma", tiles, ksteps, warps_k, half,
# split_k): the fastest split in `benchmarks/gemv.py --sweep fma|mma|warps --sweep-m 1,2,4` (H200; µs per call, cold
# weights, graph replay; cuBLAS in brackets; docs/BENCHMARKS.md, decisions: TUNED). M = 2 is the decode step (batch 1
# with CFG); M = 1 and 4 are batch 1 without CFG and batch 2 with it. The tensor-core kernel wins where the FMA
# kernel's arithmetic shows (M = 4, many rows); the FMA kernel's 512-byte row runs win where it does not. Streaming
# loads help the K = 2048 shapes with many rows and hurt the (2, 4) tile at K ≥ 4096 at M = 2 (out_proj 6.78 vs
# 5.14 µs). Capping the warps along K (fewer, longer-running CTAs; the fifth field) won at qkv and at fc1 M = 2
# (`--sweep warps`).
TUNED: dict[tuple[int, int, int], tuple] = {
    (1, 8512, 2048): ("fma", 1, 8, False),  # Mamba2 in_proj: 8.83 (11.36)
    (1, 2048, 4096): ("fma", 2, 4, False),  # Mamba2 out_proj: 5.06 (9.40)
    (1, 3072, 2048): ("fma", 2, 4, False, 2),  # attention qkv: 4.05 (6.52; v1 r8 4.15)
    (1, 2048, 2048): ("fma", 8, 1, False),  # attention out: 3.45 (6.05)
    (1, 16384, 2048): ("fma", 2, 4, False),  # MLP fc1: 17.19 (18.99)
    (1, 2048, 8192): ("fma", 4, 2, False),  # MLP fc2: 9.70 (14.17)
    (1, 9232, 2048): ("fma", 1, 8, False),  # the 9 heads, stacked and padded: 9.88 (13.48)
    (2, 8512, 2048): ("mma", 1, 4, 8, True, True),  # Mamba2 in_proj: 9.97 (11.75; FMA 10.30)
    (2, 2048, 4096): ("fma", 2, 4, False),  # Mamba2 out_proj: 5.14 (9.61)
    (2, 3072, 2048): ("fma", 2, 4, False, 2),  # attention qkv: 4.14 (6.52; v1 r8 4.25)
    (2, 2048, 2048): ("fma", 2, 4, False),  # attention out: 3.58 (6.07)
    (2, 16384, 2048): ("fma", 2, 4, False, 1),  # MLP fc1: 17.32 (19.05; tensor cores 17.93)
    (2, 2048, 8192): ("fma", 2, 4, False),  # MLP fc2: 9.25 (13.81)
    (2, 9232, 2048): ("mma", 1, 4, 8, True, True),  # the 9 heads: 10.74 (13.36; FMA 10.86)
    (4, 8512, 2048): ("mma", 1, 4, 8, True, True),  # Mamba2 in_proj: 9.93 (11.81; FMA 12.68)
    (4, 2048, 4096): ("mma", 1, 4, 16, True, False),  # Mamba2 out_proj: 6.17 (9.41; FMA 6.73)
    (4, 3072, 2048): ("fma", 2, 4, False, 2),  # attention qkv: 4.59 (6.53; tensor cores 4.75)
    (4, 2048, 2048): ("mma", 1, 4, 16, True, True),  # attention out: 3.80 (6.09; FMA 4.12)
    (4, 16384, 2048): ("mma", 1, 4, 8, True, True),  # MLP fc1: 17.62 (19.01; FMA 21.86)
    (4, 2048, 8192): ("mma", 1, 4, 16, True, False),  # MLP fc2: 10.41 (14.17; FMA 10.84)
    (4, 9232, 2048): ("mma", 1, 4, 8, True, True),  # the 9 heads: 10.66 (13.40; FMA 13.55)
    # M = 8 (`--sweep mma --sweep-m 8`); M = 5..7 use these too: the tensor cores compute 8 columns whatever M.
    (8, 8512, 2048): ("mma", 1, 8, 8, True, True),  # Mamba2 in_proj: 10.41 (11.55; FMA 17.40)
    (8, 2048, 4096): ("mma", 2, 4, 4, True, True),  # Mamba2 out_proj: 8.24 (9.46; FMA 8.40)
    (8, 3072, 2048): ("mma", 1, 8, 8, True, True),  # attention qkv: 4.92 (6.52; FMA 7.87)
    (8, 2048, 2048): ("mma", 1, 8, 8, True, True),  # attention out: 4.20 (6.10; FMA 5.52)
    (8, 16384, 2048): ("mma", 2, 2, 4, False, True),  # MLP fc1: 18.15 (19.15; FMA 30.99)
    (8, 2048, 8192): ("mma", 1, 4, 8, True, True),  # MLP fc2: 13.03 (13.62; FMA 14.03)
    (8, 9232, 2048): ("mma", 1, 8, 8, True, True),  # the 9 heads: 11.05 (12.71; FMA 18.52)
}


def gemv_config(m: int, n: int, k: int) -> GemvConfig:
    """The work split for x (m, k) · W (n, k)ᵀ: the :data:`TUNED` entry (M = 5..7 take M = 8's), else the
    tensor-core kernel's 8-row tiles for M = 5..8 and the FMA kernel's lane tile for other M."""
    many = 4 < m <= MMA_COLS
    entry = TUNED.get((MMA_COLS if many else m, n, k))
    if entry is None:
        return mma_config(m, n, k, ksteps=8, warps_k=8, half=True) if many else fma_config(m, n, k)
    kind, *tile = entry
    if kind == "mma":
        tiles, ksteps, warps_k, half, split_k = tile
        return mma_config(m, n, k, tiles=tiles, ksteps=ksteps, warps_k=warps_k, half=half, split_k=split_k)
    vecs, rows, stream_loads, *cap = tile
    max_warps_k = cap[0] if cap else MAX_WARPS_K
    return fma_config(m, n, k, vecs=vecs, rows=rows, stream_loads=stream_loads, max_warps_k=max_warps_k)


def fma_config(
    m: int,
    n: int,
    k: int,
    vecs: int | None = None,
    rows: int | None = None,
    stream_loads: bool = True,
    max_warps_k: int = MAX_WARPS_K,
) -> FmaConfig:
    """The FMA kernel's split with ``vecs`` × ``rows`` weight vectors per lane (default: :data:`LANE_TILES`), up to
    ``max_warps_k`` warps along K."""
    tile = lane_tile(m)
    vecs, rows = vecs or tile[0], rows or tile[1]
    warps_k, warps_n, splits = _grid_shape(n, k, rows, WARP * vecs, max_warps_k)
    return FmaConfig(vecs=vecs, rows=rows, warps_k=warps_k, warps_n=warps_n, splits=splits, stream_loads=stream_loads)


def mma_config(
    m: int,
    n: int,
    k: int,
    tiles: int = 1,
    ksteps: int = 4,
    warps_k: int = 4,
    half: bool = False,
    split_k: bool = True,
) -> MmaConfig:
    """The tensor-core kernel's split with ``tiles`` tiles of 16 (``half``: 8) rows and ``ksteps`` k-steps per warp,
    up to ``warps_k`` warps along K; ``split_k=False``: never split K across CTAs."""
    rows = (MMA_ROWS // 2 if half else MMA_ROWS) * tiles
    warps_k, warps_n, splits = _grid_shape(n, k, rows, MMA_LANES_K * ksteps, warps_k)
    if not split_k:
        splits = 1
    return MmaConfig(tiles=tiles, ksteps=ksteps, warps_k=warps_k, warps_n=warps_n, splits=splits, half=half)


def _grid_shape(n: int, k: int, rows: int, chunk_vecs: int, max_warps_k: int) -> tuple[int, int, int]:
    """(warps_k, warps_n, splits) for warps of ``rows`` rows walking chunks of ``chunk_vecs`` vectors: up to
    ``max_warps_k`` warps along K, at least :data:`MIN_WARPS_PER_CTA` per CTA, and split-K when the row blocks
    alone give fewer than :data:`MIN_CTAS` CTAs."""
    chunks = cdiv(k // VEC, chunk_vecs)
    warps_k = min(chunks, max_warps_k)
    warps_n = max(1, MIN_WARPS_PER_CTA // warps_k)
    row_blocks = cdiv(n, rows * warps_n)
    per_warp = cdiv(chunks, warps_k)
    splits = 1
    if row_blocks < MIN_CTAS and per_warp > 1:
        splits = min(per_warp, cdiv(MIN_CTAS, row_blocks))
        splits = cdiv(per_warp, cdiv(per_warp, splits))  # no split left without a chunk
    return warps_k, warps_n, splits


def candidate_configs(m: int, n: int, k: int) -> list[GemvConfig]:
    """The default split first, then the FMA splits ``benchmarks/gemv.py`` times against it: lane tiles of 8
    and 16 weight vectors with plain and streaming loads, and the FMA default with interleaved loads, with two
    splits and without programmatic dependent launch."""
    base = fma_config(m, n, k)
    out = [base]
    # 8 weight vectors (128 B) in flight per lane, then 16 (256 B: more bytes per thread, fewer CTAs per SM).
    for vecs, rows in ((8, 1), (4, 2), (2, 4), (1, 8), (8, 2), (4, 4), (2, 8)):
        for stream_loads in (True, False):
            out.append(fma_config(m, n, k, vecs=vecs, rows=rows, stream_loads=stream_loads))
    out.append(replace(base, hoist_loads=False))
    if base.splits == 1 and cdiv(cdiv(k // VEC, base.chunk_vecs), base.warps_k) > 1:
        out.append(replace(base, splits=2))
    out.append(replace(base, pdl=False))
    return _valid([gemv_config(m, n, k), *out], m, n, k)


def mma_candidates(m: int, n: int, k: int) -> list[MmaConfig]:
    """Tensor-core splits ``benchmarks/gemv.py --sweep mma`` times: tiles of 16 or 8 rows (``half``), 1 or 2 per
    warp, 2, 4 or 8 k-steps (64-256 bytes of weights in flight per lane), 4, 8 or 16 warps along K; and each
    split-K one without its split (the rows may give enough warps: 8 per CTA at N = 2048 is 2048 warps)."""
    out = []
    for tiles, ksteps, warps_k, half in (
        (1, 2, 4, False),
        (1, 4, 4, False),
        (2, 2, 4, False),
        (1, 8, 8, False),
        (1, 4, 4, True),
        (1, 8, 4, True),
        (2, 4, 4, True),
        (1, 8, 8, True),
        (1, 4, 8, True),
        (1, 4, 16, True),
    ):
        for split_k in (True, False):
            out.append(mma_config(m, n, k, tiles=tiles, ksteps=ksteps, warps_k=warps_k, half=half, split_k=split_k))
    return _valid(out, m, n, k)


def occupancy_candidates(m: int, n: int, k: int) -> list[GemvConfig]:
    """Splits ``benchmarks/gemv.py --sweep occupancy`` times: the tuned split and the FMA kernel's one-vector,
    8-row lane tile, each as compiled and with 4-8 CTAs per SM imposed (``min_ctas``): fewer registers, possibly
    spilling, for fewer waves. On the H200 it brought the FMA split at in_proj M = 2 from 10.68 to 10.09 µs (104 →
    96 registers, 2.02 → 1.61 waves), level with the tuned tensor-core split, and no tuned split gained more than
    2% (docs/BENCHMARKS.md, decisions: min_ctas)."""
    out = []
    for base in (gemv_config(m, n, k), fma_config(m, n, k, vecs=1, rows=8, stream_loads=False)):
        out += [replace(base, min_ctas=c) for c in (0, 4, 5, 6, 7, 8)]
    return _valid(out, m, n, k)


def warps_candidates(m: int, n: int, k: int) -> list[GemvConfig]:
    """Splits ``benchmarks/gemv.py --sweep warps`` times: the tuned split, then the FMA lane tiles of 8 weight vectors
    (v1 r8, v2 r4; plain loads) with up to 1, 2 or 4 warps along K. Fewer warps along K make fewer CTAs that each
    walk more of K, more of them resident at once."""
    out = [gemv_config(m, n, k)]
    for vecs, rows in ((1, 8), (2, 4)):
        for max_warps_k in (1, 2, 4):
            out.append(fma_config(m, n, k, vecs=vecs, rows=rows, stream_loads=False, max_warps_k=max_warps_k))
    return _valid(out, m, n, k)


def _valid(configs: list, m: int, n: int, k: int) -> list:
    """``configs`` without the ones that cannot compute the problem, and without repeats, in order."""
    unique = []
    for c in configs:
        try:
            c.check(m, n, k)
        except ValueError:
            continue
        if c not in unique:
            unique.append(c)
    return unique


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
