"""Skinny GEMV in CuTeDSL: y = x Wᵀ for a few rows of x (the decode step) against a weight read once.

One compiled kernel per (M, N, K, dtype, :class:`~zonos_accel.gemv.config.GemvConfig`): shapes are
compile-time constants, so every index, bound and predicate folds to constants except block and thread
ids, and the Zonos shapes compile without predicates. The work split and its index map are in
:mod:`zonos_accel.gemv.config`.

:class:`FmaGemv`, per lane: issue all of an iteration's 128-bit loads (``rows * vecs`` weight vectors, then
``M * vecs`` x vectors; with ``pdl``, x only after the previous kernel finished), then FMA chains in fp32, one
per (x row, weight row). Then a butterfly shuffle sums each warp, shared memory sums a CTA's ``warps_k`` warps
in order, and the total is rounded once to the output dtype (or, split-K, written as an fp32 partial that
:meth:`FmaGemv.split_sum_kernel` sums in order of split).

:class:`MmaGemv` loads the same way but multiplies on the tensor cores: the 128-bit vectors are the
``mma.m16n8k16`` fragments as loaded (see :class:`~zonos_accel.gemv.config.MmaConfig`), each lane ends with
whole sums over its K range, and only the warps along K are summed, through shared memory as above.

Both load every weight element once per call, for all M rows of x. Weight rows past N are clamped to row N-1
for loading (valid memory; those results are never stored); vectors past K are predicated off.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.runtime import make_ptr
from cutlass.cutlass_dsl import T, dsl_user_op

from zonos_accel.gemv.config import MMA_LANES_K, VEC, WARP, GemvConfig, MmaConfig, cdiv

CUTE_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}
GMEM = cute.AddressSpace.gmem


@dsl_user_op
def load_streaming(src: cute.Tensor, dst: cute.Tensor, *, loc=None, ip=None) -> None:
    """``dst`` (8 registers of 16 bits) ← ``src`` (8 contiguous, 16-byte aligned 16-bit elements in global
    memory) with one read-only streaming load: no L1 allocation, 256-byte L2 prefetch."""
    i32 = T.i32()
    words = llvm.inline_asm(
        llvm.StructType.get_literal([i32] * 4),
        [src.iterator.llvm_ptr],
        "ld.global.nc.L1::no_allocate.L2::256B.v4.b32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,l",
        has_side_effects=True,  # never speculated past the predicate that guards a ragged K
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )
    dst32 = cute.recast_tensor(dst, Int32, loc=loc, ip=ip)
    for i in range(4):
        dst32[i] = Int32(llvm.extractvalue(i32, words, [i], loc=loc, ip=ip))


@dsl_user_op
def mma_16816(a: list, b: list, c: list, ptx_type: str, *, loc=None, ip=None) -> list:
    """D (16 × 8, fp32) = A (16 × 16) · B (16 × 8) + C with ``mma.sync.m16n8k16``: ``a`` 4 and ``b`` 2 registers of
    two 16-bit ``ptx_type`` elements each, ``c`` 4 Float32, in the PTX fragment order."""
    f32 = T.f32()
    operands = [Int32(v).ir_value(loc=loc, ip=ip) for v in (*a, *b)] + [Float32(v).ir_value(loc=loc, ip=ip) for v in c]
    d = llvm.inline_asm(
        llvm.StructType.get_literal([f32] * 4),
        operands,
        f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}.{ptx_type}.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )
    return [Float32(llvm.extractvalue(f32, d, [i], loc=loc, ip=ip)) for i in range(4)]


class FmaGemv:
    """y (M, N) = x (M, K) · W (N, K)ᵀ, 16-bit in and out, fp32 accumulation; see the module docstring."""

    def __init__(self, dtype: type[cutlass.Numeric], m: int, n: int, k: int, config: GemvConfig):
        if dtype.width != 16:
            raise ValueError(f"FmaGemv takes 16-bit inputs, got {dtype}")
        config.check(m, n, k)
        self.dtype = dtype
        self.m, self.n, self.k = m, n, k
        self.cfg = config
        self.kvecs = k // VEC  # 128-bit vectors per row
        self.iters = config.iters(k)
        self.row_blocks = config.row_blocks(n)
        # Static facts that remove predicates from the common (Zonos) shapes.
        self.k_exact = config.k_exact(k)
        self.n_exact = config.n_exact(n)

    # ------------------------------------------------------------------------------------- host side

    @cute.jit
    def __call__(
        self,
        x_ptr: cute.Pointer,
        w_ptr: cute.Pointer,
        y_ptr: cute.Pointer,
        partial_ptr: cute.Pointer,
        stream: cuda.CUstream,
    ):
        cfg = self.cfg
        m, n, k = self.m, self.n, self.k
        # Row-major operands viewed as 128-bit vectors: ((1, 8), (rows, K / 8)).
        gX = cute.zipped_divide(cute.make_tensor(x_ptr, cute.make_layout((m, k), stride=(k, 1))), (1, VEC))
        gW = cute.zipped_divide(cute.make_tensor(w_ptr, cute.make_layout((n, k), stride=(k, 1))), (1, VEC))
        mY = cute.make_tensor(y_ptr, cute.make_layout((m, n), stride=(n, 1)))
        launch = dict(block=[cfg.threads, 1, 1], stream=stream, use_pdl=cfg.pdl, min_blocks_per_mp=cfg.min_ctas)
        if const_expr(cfg.splits == 1):
            self.gemv_kernel(gX, gW, mY).launch(grid=[self.row_blocks, 1, 1], **launch)
        else:
            mP = cute.make_tensor(partial_ptr, cute.make_layout((cfg.splits, m, n), stride=(m * n, n, 1)))
            self.gemv_kernel(gX, gW, mP).launch(grid=[self.row_blocks, cfg.splits, 1], **launch)
            self.split_sum_kernel(mP, mY).launch(grid=[cdiv(m * n, 256), 1, 1], block=[256, 1, 1], stream=stream)

    # ---------------------------------------------------------------------------------------- kernels

    @cute.kernel
    def gemv_kernel(self, gX: cute.Tensor, gW: cute.Tensor, mOut: cute.Tensor):
        cfg = self.cfg
        M, R, V = self.m, cfg.rows, cfg.vecs
        tidx, _, _ = cute.arch.thread_idx()
        bid_n, bid_s, _ = cute.arch.block_idx()
        lane = tidx % WARP
        warp = tidx // WARP
        wk = warp % cfg.warps_k
        wn = warp // cfg.warps_k
        row0 = cfg.first_row(bid_n, wn)

        copy_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        acc = cute.make_rmem_tensor((M, R), Float32)
        acc.fill(0.0)
        for it in cutlass.range_constexpr(self.iters):
            # The weight vectors first (rows * vecs 128-bit loads per lane), then x (M * vecs).
            xv = cute.make_rmem_tensor((VEC, V, M), self.dtype)
            wv = cute.make_rmem_tensor((VEC, V, R), self.dtype)
            if const_expr(not self.k_exact):
                xv.fill(0.0)
                wv.fill(0.0)
            for v in cutlass.range_constexpr(V):
                kv = cfg.kvec(it, bid_s, wk, lane, v)
                if const_expr(self.k_exact):
                    self._load_weights(copy_atom, gW, wv, row0, kv, v)
                else:
                    if kv < self.kvecs:
                        self._load_weights(copy_atom, gW, wv, row0, kv, v)
            # No load crosses either of these, so all of the iteration's weight loads are in flight before the
            # first FMA (cfg.hoist_loads).
            if const_expr(cfg.pdl and it == 0):
                cute.arch.griddepcontrol_wait()  # x is the previous kernel's output: wait for it to finish
            elif const_expr(cfg.hoist_loads):
                cute.arch.barrier()
            for v in cutlass.range_constexpr(V):
                kv = cfg.kvec(it, bid_s, wk, lane, v)
                for mi in cutlass.range_constexpr(M):
                    if const_expr(self.k_exact):
                        cute.copy(copy_atom, gX[None, (mi, kv)], xv[None, v, mi])
                    else:
                        if kv < self.kvecs:
                            cute.copy(copy_atom, gX[None, (mi, kv)], xv[None, v, mi])
            if const_expr(cfg.pdl and it == 0):
                cute.arch.griddepcontrol_launch_dependents()
            xf = cute.make_rmem_tensor((VEC, V, M), Float32)
            xf.store(xv.load().to(Float32))
            wf = cute.make_rmem_tensor((VEC, V, R), Float32)
            wf.store(wv.load().to(Float32))
            for r in cutlass.range_constexpr(R):
                for mi in cutlass.range_constexpr(M):
                    s = acc[mi, r]
                    for v in cutlass.range_constexpr(V):
                        for e in cutlass.range_constexpr(VEC):
                            s = s + wf[e, v, r] * xf[e, v, mi]
                    acc[mi, r] = s

        # Sum over the warp's lanes (every lane ends with the totals).
        for mi in cutlass.range_constexpr(M):
            for r in cutlass.range_constexpr(R):
                s = acc[mi, r]
                for sh in cutlass.range_constexpr(5):
                    s = s + cute.arch.shuffle_sync_bfly(s, offset=1 << (4 - sh))
                acc[mi, r] = s

        if const_expr(cfg.warps_k == 1):
            if lane == 0:
                for mi in cutlass.range_constexpr(M):
                    for r in cutlass.range_constexpr(R):
                        self._store(mOut, bid_s, mi, row0 + r, acc[mi, r])
        else:
            sRed = self._warp_sums(cutlass.utils.SmemAllocator())
            if lane == 0:
                for mi in cutlass.range_constexpr(M):
                    for r in cutlass.range_constexpr(R):
                        sRed[mi * R + r, wk, wn] = acc[mi, r]
            self._sum_warps_and_store(mOut, sRed, tidx, bid_n, bid_s)

    @cute.kernel
    def split_sum_kernel(self, mP: cute.Tensor, mY: cute.Tensor):
        """y[m, n] = Σ_s partial[s, m, n] in order of s, rounded once."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * 256 + tidx
        if i < self.m * self.n:
            mi = i // self.n
            col = i % self.n
            s = mP[0, mi, col]
            for sp in cutlass.range_constexpr(1, self.cfg.splits):
                s = s + mP[sp, mi, col]
            mY[mi, col] = s.to(self.dtype)

    # -------------------------------------------------------------------------------------- helpers

    def _warp_sums(self, smem: cutlass.utils.SmemAllocator) -> cute.Tensor:
        """Shared memory for each warp's sums: [x row * rows + row, warp along K, warp group along N]."""
        MR = self.m * self.cfg.rows
        layout = cute.make_layout((MR, self.cfg.warps_k, self.cfg.warps_n), stride=(1, MR, MR * self.cfg.warps_k))
        return smem.allocate_tensor(Float32, layout, 16)

    @cute.jit
    def _sum_warps_and_store(self, mOut: cute.Tensor, sRed: cute.Tensor, tidx: Int32, bid_n: Int32, bid_s: Int32):
        """Once every warp has written its sums to ``sRed``: sum them over the CTA's warps along K, in order, and
        store."""
        cfg = self.cfg
        MR = self.m * cfg.rows
        cute.arch.sync_threads()
        for rnd in cutlass.range_constexpr(cdiv(MR * cfg.warps_n, cfg.threads)):
            i = rnd * cfg.threads + tidx
            if i < MR * cfg.warps_n:
                item = i % MR
                grp = i // MR
                total = sRed[item, 0, grp]
                for w in cutlass.range_constexpr(1, cfg.warps_k):
                    total = total + sRed[item, w, grp]
                self._store(mOut, bid_s, item // cfg.rows, cfg.first_row(bid_n, grp) + item % cfg.rows, total)

    @cute.jit
    def _load_weights(
        self,
        copy_atom: cute.CopyAtom,
        gW: cute.Tensor,
        wv: cute.Tensor,
        row0: Int32,
        kv: Int32,
        v: cutlass.Constexpr[int],
    ):
        """Vector ``kv`` (along K / 8) of each of the warp's weight rows → registers ``wv[:, v, :]``."""
        for r in cutlass.range_constexpr(self.cfg.rows):
            self._load_vector(copy_atom, gW[None, (self._load_row(row0 + r), kv)], wv[None, v, r])

    @cute.jit
    def _load_vector(self, copy_atom: cute.CopyAtom, src: cute.Tensor, dst: cute.Tensor):
        """One 128-bit weight vector, with a streaming load if the split asks for it."""
        if const_expr(self.cfg.stream_loads):
            load_streaming(src, dst)
        else:
            cute.copy(copy_atom, src, dst)

    @cute.jit
    def _load_row(self, row: Int32) -> Int32:
        """Rows past N load row N-1 (valid memory; the result is never stored)."""
        if const_expr(self.n_exact):
            return row
        else:
            return cutlass.min(row, self.n - 1)

    @cute.jit
    def _store(self, mOut: cute.Tensor, split: Int32, mi: Int32, row: Int32, value: Float32):
        """Write the result for x row ``mi`` and weight row ``row``: to y in the output dtype, or to the fp32
        partials of this split."""
        if const_expr(self.cfg.splits == 1):
            if const_expr(self.n_exact):
                mOut[mi, row] = value.to(self.dtype)
            else:
                if row < self.n:
                    mOut[mi, row] = value.to(self.dtype)
        else:
            if const_expr(self.n_exact):
                mOut[split, mi, row] = value
            else:
                if row < self.n:
                    mOut[split, mi, row] = value


class MmaGemv(FmaGemv):
    """The same product on tensor cores (:class:`~zonos_accel.gemv.config.MmaConfig`): no conversions, no
    per-element FMAs, no shuffles; the fragments come straight from the 128-bit loads."""

    @cute.kernel
    def gemv_kernel(self, gX: cute.Tensor, gW: cute.Tensor, mOut: cute.Tensor):
        cfg = self.cfg
        M, TL, S = self.m, cfg.tiles, cfg.ksteps
        ptx_type = "bf16" if const_expr(self.dtype is cutlass.BFloat16) else "f16"
        tidx, _, _ = cute.arch.thread_idx()
        bid_n, bid_s, _ = cute.arch.block_idx()
        lane = tidx % WARP
        warp = tidx // WARP
        g = lane // MMA_LANES_K  # row (of each 8-row half of a tile) and x row of this lane
        c = lane % MMA_LANES_K  # vector within the k-step
        wk = warp % cfg.warps_k
        wn = warp // cfg.warps_k
        row0 = cfg.first_row(bid_n, wn)
        copy_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        acc = cute.make_rmem_tensor((4, TL), Float32)
        acc.fill(0.0)
        for it in cutlass.range_constexpr(self.iters):
            wv = cute.make_rmem_tensor((VEC, S, cfg.halves, TL), self.dtype)
            xv = cute.make_rmem_tensor((VEC, S), self.dtype)
            xv.fill(0.0)  # x rows past M (and vectors past K) stay zero
            if const_expr(not self.k_exact):
                wv.fill(0.0)
            for s in cutlass.range_constexpr(S):
                kv = cfg.kvec(it, bid_s, wk, c, s)
                if const_expr(self.k_exact):
                    self._load_tiles(copy_atom, gW, wv, row0 + g, kv, s)
                else:
                    if kv < self.kvecs:
                        self._load_tiles(copy_atom, gW, wv, row0 + g, kv, s)
            if const_expr(cfg.pdl and it == 0):
                cute.arch.griddepcontrol_wait()
            elif const_expr(cfg.hoist_loads):
                cute.arch.barrier()
            if g < M:
                for s in cutlass.range_constexpr(S):
                    kv = cfg.kvec(it, bid_s, wk, c, s)
                    if const_expr(self.k_exact):
                        cute.copy(copy_atom, gX[None, (g, kv)], xv[None, s])
                    else:
                        if kv < self.kvecs:
                            cute.copy(copy_atom, gX[None, (g, kv)], xv[None, s])
            if const_expr(cfg.pdl and it == 0):
                cute.arch.griddepcontrol_launch_dependents()
            w32 = cute.recast_tensor(wv, Int32)  # (4, S, halves, TL): words of two elements
            h1 = cfg.halves - 1  # the fragment's rows g + 8: the second half, or row g again
            x32 = cute.recast_tensor(xv, Int32)  # (4, S)
            for t in cutlass.range_constexpr(TL):
                for s in cutlass.range_constexpr(S):
                    for half in cutlass.range_constexpr(2):  # elements 0-3, then 4-7, of the vectors
                        w0, w1 = 2 * half, 2 * half + 1
                        d = mma_16816(
                            [w32[w0, s, 0, t], w32[w0, s, h1, t], w32[w1, s, 0, t], w32[w1, s, h1, t]],
                            [x32[w0, s], x32[w1, s]],
                            [acc[0, t], acc[1, t], acc[2, t], acc[3, t]],
                            ptx_type,
                        )
                        for i in cutlass.range_constexpr(4):
                            acc[i, t] = d[i]

        # acc[2 h + j, t] is the sum for x row 2 c + j and weight row row0 + tile_rows t + 8 h + g.
        TR = cfg.tile_rows
        if const_expr(cfg.warps_k == 1):
            for t in cutlass.range_constexpr(TL):
                for h in cutlass.range_constexpr(cfg.halves):
                    for j in cutlass.range_constexpr(2):
                        if 2 * c + j < M:
                            self._store(mOut, bid_s, 2 * c + j, row0 + TR * t + 8 * h + g, acc[2 * h + j, t])
        else:
            sRed = self._warp_sums(cutlass.utils.SmemAllocator())
            for t in cutlass.range_constexpr(TL):
                for h in cutlass.range_constexpr(cfg.halves):
                    for j in cutlass.range_constexpr(2):
                        if 2 * c + j < M:
                            sRed[(2 * c + j) * cfg.rows + TR * t + 8 * h + g, wk, wn] = acc[2 * h + j, t]
            self._sum_warps_and_store(mOut, sRed, tidx, bid_n, bid_s)

    @cute.jit
    def _load_tiles(
        self,
        copy_atom: cute.CopyAtom,
        gW: cute.Tensor,
        wv: cute.Tensor,
        row: Int32,
        kv: Int32,
        s: cutlass.Constexpr[int],
    ):
        """Vector ``kv`` of weight rows ``row + tile_rows t + 8 h`` → registers ``wv[:, s, h, t]``."""
        for t in cutlass.range_constexpr(self.cfg.tiles):
            for h in cutlass.range_constexpr(self.cfg.halves):
                src = gW[None, (self._load_row(row + self.cfg.tile_rows * t + 8 * h), kv)]
                self._load_vector(copy_atom, src, wv[None, s, h, t])


def launch_args(dtype: type[cutlass.Numeric], x: int, w: int, y: int, partial: int, stream: int) -> tuple:
    """:meth:`FmaGemv.__call__`'s arguments from device addresses (16-byte aligned) and a stream handle."""
    return (
        make_ptr(dtype, x, GMEM, assumed_align=16),
        make_ptr(dtype, w, GMEM, assumed_align=16),
        make_ptr(dtype, y, GMEM, assumed_align=16),
        make_ptr(Float32, partial, GMEM, assumed_align=16),
        cuda.CUstream(stream),
    )


def compile_gemv(
    dtype: type[cutlass.Numeric], m: int, n: int, k: int, config: GemvConfig, args: tuple, options: str = ""
):
    """Compile the kernel of ``config`` (:class:`FmaGemv` or :class:`MmaGemv`) for one problem; ``args`` are example
    :func:`launch_args`."""
    cls = MmaGemv if isinstance(config, MmaConfig) else FmaGemv
    return cute.compile(cls(dtype, m, n, k, config), *args, options=options)
