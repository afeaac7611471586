"""The Mamba2 SSD scan over one chunk of at most 256 tokens as one CuTeDSL kernel (``use_cute_scan``).

One CTA of 8 warps owns one (sequence, head). With ``a_t = dt_t · A`` and ``cum_t = a_0 + … + a_t``:

    y_t     = exp(cum_t) · C_t · S0ᵀ + Σ_{s ≤ t} (C_t · B_s) · exp(cum_t − cum_s) · dt_s · x_s + D · x_t
    S_final = exp(cum_last) · S0 + Σ_s exp(cum_last − cum_s) · dt_s · x_sᵀ ⊗ B_s

1. Load (all threads): dt and the inclusive cumsum of dt · A (one token per thread, a warp scan and a CTA
   pass), C and B rows (t × n), xᵀ (p × t) and the initial state S0 (p × n, as bf16 hi + lo parts when it is
   fp32) into shared memory, rows past the chunk's length zero up to the next multiple of 16 (nothing reads
   further).
2. Output, in strips of 16 tokens up to the chunk's length: strip w to warp w, and past 8 strips also strip
   ``strips − 1 − w`` (≥ 8), which balances the causal triangle's blocks. The strip's C fragments stay in
   registers; the initial-state term C · S0ᵀ, scaled by
   exp(cum_t); then per 16-token block s ≤ t: G = C · Bᵀ on the tensor cores, the decay mask and dt applied
   in the accumulator, which becomes the A operand of G · x (the accumulator layout of ``mma.m16n8k16`` is its
   A operand layout, as in flash attention), and D · x; y in x's dtype.
3. Final state (every warp, one 16 × 64 tile of p × n): xᵀ · (w_s B_s) over the chunk with w_s =
   exp(cum_last − cum_s) dt_s split into bf16 hi + lo parts (two products, so the state's error stays
   near fp32's), plus exp(cum_last) · S0 in fp32 from global memory; stored in fp32.

Phases 2 and 3 read only what phase 1 wrote, so warps idle in phase 2 start phase 3 at once. The final state
may alias the initial state (the chunk loop of :func:`zonos_accel.ssd.ssd_scan` updates one buffer): every S0
element is read into shared memory before the barrier, and the fp32 carry term is read and written by the
same thread.

The head dim p (≤ 64), the state size n (64 or 128) and the initial state's presence and dtype are compile-time
constants; shared memory is laid out for 256 tokens, and the chunk's length, the strides and the head → group
ratio are runtime values, so one compiled kernel serves every prompt length.

Loops are ``cutlass.range(..., unroll_full=True)`` (traced once, unrolled by the compiler) wherever their index
only addresses memory or register fragments; ``range_constexpr`` (unrolled while tracing) stays where the index is
a Python value (a list index, a shuffle offset) or a body assigns a name first bound inside it. Every process
traces the kernel again (CuTeDSL's file cache is keyed by the traced module), and this halves that: 2.2 / 2.4 s
against 4.1 / 5.0 s to compile the bf16 / fp32-state kernels for sm_90a on a 2-core CPU, with the same PTX
memory operations and tensor-core products (two parameter loads fewer).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.runtime import make_ptr
from cutlass.cutlass_dsl import T, dsl_user_op

from zonos_accel.gemv.kernel import mma_16816

GMEM = cute.AddressSpace.gmem
WARPS = 8
THREADS = 32 * WARPS
VEC = 8  # 16-bit elements per 128-bit load
PAD = 8  # elements added to each shared-memory row: rows 16 bytes apart in bank order, conflict-free fragments
LOG2E = 1.4426950408889634
MAX_T = 256


@dsl_user_op
def pack_bf16x2(lo: Float32, hi: Float32, *, loc=None, ip=None) -> Int32:
    """Two fp32 values rounded to bf16 in one 32-bit register, ``lo`` in the low half (the lower k index)."""
    return Int32(
        llvm.inline_asm(
            T.i32(),
            [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
            "cvt.rn.bf16x2.f32 $0, $1, $2;",
            "=r,f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
            loc=loc,
            ip=ip,
        )
    )


def _bf16(v: Float32) -> Float32:
    """v rounded to bf16 and back."""
    return v.to(BFloat16).to(Float32)


class ChunkScan:
    """One chunk of the SSD scan for every (sequence, head); see the module docstring."""

    def __init__(self, p: int, n: int, has_init: bool, init_fp32: bool, batched_loads: bool = False):
        if p % 16 or not 0 < p <= 64 or n not in (64, 128):
            raise ValueError(f"ChunkScan takes a head dim p ≤ 64 (a multiple of 16), a state of 64 or 128: {p}, {n}")
        self.T, self.p, self.n = MAX_T, p, n
        self.has_init, self.init_fp32 = has_init, init_fp32
        # batched_loads: C and B by cp.async, x and S0 loaded into registers all at once before any store to
        # shared memory (instead of a load, then its store, per vector)
        self.batched_loads = batched_loads
        self.state_tiles = (p // 16) * (n // 64)  # 16 × 64 tiles of the final state, at most one per warp

    # ------------------------------------------------------------------------------------- host side

    @cute.jit
    def __call__(
        self,
        x_ptr: cute.Pointer,
        dt_ptr: cute.Pointer,
        A_ptr: cute.Pointer,
        B_ptr: cute.Pointer,
        C_ptr: cute.Pointer,
        D_ptr: cute.Pointer,
        s0_ptr: cute.Pointer,
        y_ptr: cute.Pointer,
        sf_ptr: cute.Pointer,
        length: Int32,
        sxb: Int32,
        sxt: Int32,
        sdb: Int32,
        sdt: Int32,
        sbb: Int32,
        sbt: Int32,
        scb: Int32,
        sct: Int32,
        syb: Int32,
        syt: Int32,
        batch: Int32,
        heads: Int32,
        heads_per_group: Int32,
        stream: cuda.CUstream,
    ):
        big = 1 << 30  # flat views: every index is computed here from the runtime strides
        flat = cute.make_layout(big)
        gX = cute.zipped_divide(cute.make_tensor(x_ptr, flat), (VEC,))
        gB = cute.zipped_divide(cute.make_tensor(B_ptr, flat), (VEC,))
        gC = cute.zipped_divide(cute.make_tensor(C_ptr, flat), (VEC,))
        gDt = cute.make_tensor(dt_ptr, flat)
        gA = cute.make_tensor(A_ptr, flat)
        gD = cute.make_tensor(D_ptr, flat)
        gS0 = cute.make_tensor(s0_ptr, flat)
        gY = cute.make_tensor(y_ptr, flat)
        gSf = cute.make_tensor(sf_ptr, flat)
        strides = (sxb, sxt, sdb, sdt, sbb, sbt, scb, sct, syb, syt)
        self.kernel(gX, gDt, gA, gB, gC, gD, gS0, gY, gSf, length, *strides, heads, heads_per_group).launch(
            grid=[heads, batch, 1], block=[THREADS, 1, 1], stream=stream
        )

    # ---------------------------------------------------------------------------------------- kernel

    @cute.kernel
    def kernel(
        self,
        gX: cute.Tensor,
        gDt: cute.Tensor,
        gA: cute.Tensor,
        gB: cute.Tensor,
        gC: cute.Tensor,
        gD: cute.Tensor,
        gS0: cute.Tensor,
        gY: cute.Tensor,
        gSf: cute.Tensor,
        length: Int32,
        sxb: Int32,
        sxt: Int32,
        sdb: Int32,
        sdt: Int32,
        sbb: Int32,
        sbt: Int32,
        scb: Int32,
        sct: Int32,
        syb: Int32,
        syt: Int32,
        heads: Int32,
        heads_per_group: Int32,
    ):
        TT, P, N = self.T, self.p, self.n
        tidx, _, _ = cute.arch.thread_idx()
        h, b, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        g = h // heads_per_group

        smem = cutlass.utils.SmemAllocator()
        sC = smem.allocate_tensor(BFloat16, cute.make_layout((TT, N + PAD), stride=(N + PAD, 1)), 16)
        sB = smem.allocate_tensor(BFloat16, cute.make_layout((TT, N + PAD), stride=(N + PAD, 1)), 16)
        sXT = smem.allocate_tensor(BFloat16, cute.make_layout((P, TT + PAD), stride=(TT + PAD, 1)), 16)
        sHi = smem.allocate_tensor(BFloat16, cute.make_layout((P, N + PAD), stride=(N + PAD, 1)), 16)
        sLo = sHi
        if const_expr(self.init_fp32):
            sLo = smem.allocate_tensor(BFloat16, cute.make_layout((P, N + PAD), stride=(N + PAD, 1)), 16)
        rows16 = (length + 15) // 16 * 16  # rows any product reads: the 16-token blocks the chunk touches
        sCum = smem.allocate_tensor(Float32, cute.make_layout(TT), 16)
        sDt = smem.allocate_tensor(Float32, cute.make_layout(TT), 16)
        sW = smem.allocate_tensor(Float32, cute.make_layout(TT), 16)
        sWarp = smem.allocate_tensor(Float32, cute.make_layout(WARPS), 16)

        # ---- phase 1: loads and the cumulative decay
        A = gA[h].to(Float32)
        dt_t = Float32(0.0)
        if tidx < length:
            dt_t = gDt[b * sdb + tidx * sdt + h].to(Float32)  # heads contiguous
        cum = dt_t * A
        for k in cutlass.range_constexpr(5):
            up = cute.arch.shuffle_sync_up(cum, offset=1 << k, mask_and_clamp=0)  # clamp 0: read lane - offset
            if lane >= (1 << k):
                cum = cum + up
        if lane == 31:
            sWarp[warp] = cum

        copy_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        load_atom = copy_atom
        if const_expr(self.batched_loads):
            load_atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), BFloat16, num_bits_per_copy=128)
        zeros = cute.make_rmem_tensor((VEC,), BFloat16)
        zeros.fill(0.0)
        sC8 = cute.zipped_divide(sC, (1, VEC))
        sB8 = cute.zipped_divide(sB, (1, VEC))
        row_vecs = N // VEC
        for it in cutlass.range_constexpr(TT * row_vecs // THREADS):
            i = it * THREADS + tidx
            t = i // row_vecs
            kv = i % row_vecs
            if t < length:
                cute.copy(load_atom, gC[None, (b * scb + t * sct + g * N) // VEC + kv], sC8[None, (t, kv)])
                cute.copy(load_atom, gB[None, (b * sbb + t * sbt + g * N) // VEC + kv], sB8[None, (t, kv)])
            elif t < rows16:
                cute.copy(copy_atom, zeros, sC8[None, (t, kv)])
                cute.copy(copy_atom, zeros, sB8[None, (t, kv)])
        if const_expr(self.batched_loads):
            cute.arch.cp_async_commit_group()
            self._load_x_and_state_batched(gX, gS0, sXT, sHi, sLo, b, h, heads, length, rows16, sxb, sxt, tidx)
            cute.arch.cp_async_wait_group(0)
        else:
            p_vecs = P // VEC
            for it in cutlass.range_constexpr(TT * p_vecs // THREADS):
                i = it * THREADS + tidx
                t = i // p_vecs
                pv = i % p_vecs
                if t < rows16:
                    xv = cute.make_rmem_tensor((VEC,), BFloat16)
                    xv.fill(0.0)
                    if t < length:
                        cute.copy(copy_atom, gX[None, (b * sxb + t * sxt + h * P) // VEC + pv], xv)
                    for e in cutlass.range_constexpr(VEC):
                        sXT[pv * VEC + e, t] = xv[e]
            if const_expr(self.has_init):
                base = (b * heads + h) * P * N
                for it in cutlass.range_constexpr(P * N // THREADS):
                    i = it * THREADS + tidx
                    v = gS0[base + i].to(Float32)
                    hi = v.to(BFloat16)
                    sHi[i // N, i % N] = hi
                    if const_expr(self.init_fp32):
                        sLo[i // N, i % N] = (v - hi.to(Float32)).to(BFloat16)

        cute.arch.sync_threads()
        for w in cutlass.range_constexpr(WARPS - 1):
            if warp > w:
                cum = cum + sWarp[w]
        sCum[tidx] = cum  # one token per thread: THREADS == MAX_T
        sDt[tidx] = dt_t
        cute.arch.sync_threads()
        cum_last = sCum[TT - 1]  # tokens past the length add nothing (dt = 0)
        sW[tidx] = cute.math.exp2((cum_last - cum) * LOG2E, fastmath=True) * dt_t
        cute.arch.sync_threads()

        sC32 = cute.recast_tensor(sC, Int32)
        sB32 = cute.recast_tensor(sB, Int32)
        sXT32 = cute.recast_tensor(sXT, Int32)
        sHi32 = cute.recast_tensor(sHi, Int32)
        sLo32 = cute.recast_tensor(sLo, Int32)
        gr = lane // 4  # fragment row (and B operand column) of this lane
        gc = lane % 4  # fragment word along k (and accumulator column pair)
        KS = N // 16  # k-steps over the state

        # ---- phase 2: outputs. Strip w (16 tokens) to warp w; past 8 strips, warp w also takes strip
        # strips - 1 - w (≥ 8), which balances the causal triangle's blocks over the warps.
        strips = rows16 // 16
        for u in cutlass.range(2, unroll_full=True):
            strip = warp + u * (strips - 1 - 2 * warp)  # u = 0: warp; u = 1: strips - 1 - warp
            if warp + u * WARPS < strips:
                t0 = strip * 16
                cfrag = cute.make_rmem_tensor((4, KS), Int32)
                for ks in cutlass.range(KS, unroll_full=True):
                    cfrag[0, ks] = sC32[t0 + gr, ks * 8 + gc]
                    cfrag[1, ks] = sC32[t0 + gr + 8, ks * 8 + gc]
                    cfrag[2, ks] = sC32[t0 + gr, ks * 8 + 4 + gc]
                    cfrag[3, ks] = sC32[t0 + gr + 8, ks * 8 + 4 + gc]
                acc = cute.make_rmem_tensor((4, P // 8), Float32)
                acc.fill(0.0)
                if const_expr(self.has_init):
                    for j in cutlass.range(P // 8, unroll_full=True):
                        for ks in cutlass.range(KS, unroll_full=True):
                            a = [cfrag[0, ks], cfrag[1, ks], cfrag[2, ks], cfrag[3, ks]]
                            bh = [sHi32[j * 8 + gr, ks * 8 + gc], sHi32[j * 8 + gr, ks * 8 + 4 + gc]]
                            d = mma_16816(a, bh, [acc[0, j], acc[1, j], acc[2, j], acc[3, j]], "bf16")
                            if const_expr(self.init_fp32):
                                bl = [sLo32[j * 8 + gr, ks * 8 + gc], sLo32[j * 8 + gr, ks * 8 + 4 + gc]]
                                d = mma_16816(a, bl, d, "bf16")
                            for r in cutlass.range_constexpr(4):
                                acc[r, j] = d[r]
                    e0 = cute.math.exp2(sCum[t0 + gr] * LOG2E, fastmath=True)
                    e1 = cute.math.exp2(sCum[t0 + gr + 8] * LOG2E, fastmath=True)
                    for j in cutlass.range_constexpr(P // 8):
                        acc[0, j] = acc[0, j] * e0
                        acc[1, j] = acc[1, j] * e0
                        acc[2, j] = acc[2, j] * e1
                        acc[3, j] = acc[3, j] * e1
                cum_r0 = sCum[t0 + gr]
                cum_r1 = sCum[t0 + gr + 8]
                for sb in cutlass.range(strip + 1):
                    self._output_block(acc, cfrag, sB32, sXT32, sCum, sDt, t0, sb * 16, gr, gc, cum_r0, cum_r1)
                dval = gD[h].to(Float32)
                for r2 in cutlass.range(2, unroll_full=True):
                    t = t0 + gr + 8 * r2
                    if t < length:
                        for j in cutlass.range(P // 8, unroll_full=True):
                            col = j * 8 + 2 * gc
                            v0 = acc[2 * r2, j]
                            v1 = acc[2 * r2 + 1, j]
                            v0 = v0 + dval * sXT[col, t].to(Float32)
                            v1 = v1 + dval * sXT[col + 1, t].to(Float32)
                            out = b * syb + t * syt + h * P + col
                            gY[out] = v0.to(gY.element_type)
                            gY[out + 1] = v1.to(gY.element_type)

        # ---- phase 3: the final state, one 16 × 64 tile per warp
        if warp < self.state_tiles:
            p0 = (warp % (P // 16)) * 16
            n0 = (warp // (P // 16)) * 64
            sacc = cute.make_rmem_tensor((4, 8), Float32)
            sacc.fill(0.0)
            for ks in cutlass.range(rows16 // 16):
                self._state_block(sacc, sXT32, sB, sW, p0, n0, ks * 16, gr, gc)
            decay = cute.math.exp2(cum_last * LOG2E, fastmath=True)
            state_base = (b * heads + h) * P * N
            for r2 in cutlass.range(2, unroll_full=True):
                for j in cutlass.range(8, unroll_full=True):
                    for e in cutlass.range(2, unroll_full=True):
                        idx = state_base + (p0 + gr + 8 * r2) * N + n0 + j * 8 + 2 * gc + e
                        total = sacc[2 * r2 + e, j]
                        if const_expr(self.has_init):
                            total = total + decay * gS0[idx].to(Float32)
                        gSf[idx] = total

    # -------------------------------------------------------------------------------------- helpers

    @cute.jit
    def _load_x_and_state_batched(
        self,
        gX: cute.Tensor,
        gS0: cute.Tensor,
        sXT: cute.Tensor,
        sHi: cute.Tensor,
        sLo: cute.Tensor,
        b: Int32,
        h: Int32,
        heads: Int32,
        length: Int32,
        rows16: Int32,
        sxb: Int32,
        sxt: Int32,
        tidx: Int32,
    ):
        """xᵀ and S0 into shared memory: every 128-bit load of the thread first, then the stores."""
        P, N = self.p, self.n
        copy_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        p_vecs = P // VEC
        XI = self.T * p_vecs // THREADS
        xall = cute.make_rmem_tensor((VEC, XI), BFloat16)
        xall.fill(0.0)
        for it in cutlass.range(XI, unroll_full=True):
            i = it * THREADS + tidx
            t = i // p_vecs
            if t < length:
                cute.copy(copy_atom, gX[None, (b * sxb + t * sxt + h * P) // VEC + i % p_vecs], xall[None, it])
        if const_expr(self.has_init):
            sv = 128 // gS0.element_type.width  # elements per 128-bit vector: 8 bf16 or 4 fp32
            vecs = P * N // sv
            SI = (vecs + THREADS - 1) // THREADS
            s_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), gS0.element_type, num_bits_per_copy=128)
            gS0v = cute.zipped_divide(gS0, (sv,))
            sall = cute.make_rmem_tensor((sv, SI), gS0.element_type)
            first = (b * heads + h) * vecs
            for it in cutlass.range(SI, unroll_full=True):
                if it * THREADS + tidx < vecs:
                    cute.copy(s_atom, gS0v[None, first + it * THREADS + tidx], sall[None, it])
        for it in cutlass.range(XI, unroll_full=True):
            i = it * THREADS + tidx
            t = i // p_vecs
            if t < rows16:
                for e in cutlass.range(VEC, unroll_full=True):
                    sXT[(i % p_vecs) * VEC + e, t] = xall[e, it]
        if const_expr(self.has_init):
            for it in cutlass.range(SI, unroll_full=True):
                vi = it * THREADS + tidx
                if vi < vecs:
                    for e in cutlass.range(sv, unroll_full=True):
                        el = vi * sv + e
                        v = sall[e, it].to(Float32)
                        hi = v.to(BFloat16)
                        sHi[el // N, el % N] = hi
                        if const_expr(self.init_fp32):
                            sLo[el // N, el % N] = (v - hi.to(Float32)).to(BFloat16)

    @cute.jit
    def _output_block(
        self,
        acc: cute.Tensor,
        cfrag: cute.Tensor,
        sB32: cute.Tensor,
        sXT32: cute.Tensor,
        sCum: cute.Tensor,
        sDt: cute.Tensor,
        t0: Int32,
        s0: Int32,
        gr: Int32,
        gc: Int32,
        cum_r0: Float32,
        cum_r1: Float32,
    ):
        """acc (the strip's y, 16 × p) += (C Bᵀ ∘ decay · dt) · x over the 16 tokens from s0."""
        KS = self.n // 16
        gacc = cute.make_rmem_tensor((4, 2), Float32)
        gacc.fill(0.0)
        for half in cutlass.range_constexpr(2):
            row = s0 + half * 8 + gr
            for ks in cutlass.range(KS, unroll_full=True):
                a = [cfrag[0, ks], cfrag[1, ks], cfrag[2, ks], cfrag[3, ks]]
                bb = [sB32[row, ks * 8 + gc], sB32[row, ks * 8 + 4 + gc]]
                d = mma_16816(a, bb, [gacc[0, half], gacc[1, half], gacc[2, half], gacc[3, half]], "bf16")
                for r in cutlass.range_constexpr(4):
                    gacc[r, half] = d[r]
        # decay mask and dt, then the accumulator as the A operand of (G ∘ decay) · x
        mfrag = cute.make_rmem_tensor((4,), Int32)
        for half in cutlass.range_constexpr(2):
            s_a = s0 + half * 8 + 2 * gc
            vals = []
            for r in cutlass.range_constexpr(4):
                t_row = t0 + gr + (8 if r >= 2 else 0)
                s_col = s_a + (r % 2)
                cum_t = cum_r1 if r >= 2 else cum_r0
                # exp(cum_t - cum_s) for s <= t, 0 above the diagonal (the exponent -1e30 there)
                arg = cutlass.min(cum_t - sCum[s_col], Float32(t_row - s_col) * Float32(1e30))
                vals.append(gacc[r, half] * cute.math.exp2(arg * LOG2E, fastmath=True) * sDt[s_col])
            mfrag[2 * half] = pack_bf16x2(vals[0], vals[1])
            mfrag[2 * half + 1] = pack_bf16x2(vals[2], vals[3])
        a = [mfrag[0], mfrag[1], mfrag[2], mfrag[3]]
        for j in cutlass.range(self.p // 8, unroll_full=True):
            bx = [sXT32[j * 8 + gr, (s0 + 2 * gc) // 2], sXT32[j * 8 + gr, (s0 + 8 + 2 * gc) // 2]]
            d = mma_16816(a, bx, [acc[0, j], acc[1, j], acc[2, j], acc[3, j]], "bf16")
            for r in cutlass.range_constexpr(4):
                acc[r, j] = d[r]

    @cute.jit
    def _state_block(
        self,
        sacc: cute.Tensor,
        sXT32: cute.Tensor,
        sB: cute.Tensor,
        sW: cute.Tensor,
        p0: Int32,
        n0: Int32,
        s0: Int32,
        gr: Int32,
        gc: Int32,
    ):
        """sacc (a 16 × 64 tile of the final state) += xᵀ · (w B) over the 16 tokens from s0, w B as bf16 hi + lo."""
        xa = [
            sXT32[p0 + gr, (s0 + 2 * gc) // 2],
            sXT32[p0 + gr + 8, (s0 + 2 * gc) // 2],
            sXT32[p0 + gr, (s0 + 8 + 2 * gc) // 2],
            sXT32[p0 + gr + 8, (s0 + 8 + 2 * gc) // 2],
        ]
        wts = [sW[s0 + 2 * gc], sW[s0 + 2 * gc + 1], sW[s0 + 2 * gc + 8], sW[s0 + 2 * gc + 9]]
        for j in cutlass.range(8, unroll_full=True):
            col = n0 + j * 8 + gr
            bv = [
                sB[s0 + 2 * gc, col].to(Float32) * wts[0],
                sB[s0 + 2 * gc + 1, col].to(Float32) * wts[1],
                sB[s0 + 2 * gc + 8, col].to(Float32) * wts[2],
                sB[s0 + 2 * gc + 9, col].to(Float32) * wts[3],
            ]
            bhi = [_bf16(e) for e in bv]
            blo = [e - f for e, f in zip(bv, bhi)]
            hi_words = [pack_bf16x2(bhi[0], bhi[1]), pack_bf16x2(bhi[2], bhi[3])]
            lo_words = [pack_bf16x2(blo[0], blo[1]), pack_bf16x2(blo[2], blo[3])]
            d = mma_16816(xa, hi_words, [sacc[r, j] for r in range(4)], "bf16")
            d = mma_16816(xa, lo_words, d, "bf16")
            for r in cutlass.range_constexpr(4):
                sacc[r, j] = d[r]


CUTE_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16, torch.float32: cutlass.Float32}


def launch_args(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    s0: torch.Tensor,
    y: torch.Tensor,
    sf: torch.Tensor,
    length: int,
    strides: tuple[int, ...],
    heads_per_group: int,
    stream: int,
) -> tuple:
    """:meth:`ChunkScan.__call__`'s arguments from torch tensors (pointers at their data, any offsets applied)."""

    def ptr(t: torch.Tensor, align: int = 4):
        return make_ptr(CUTE_DTYPES[t.dtype], t.data_ptr(), GMEM, assumed_align=align)

    return (
        ptr(x, 16),
        ptr(dt),
        ptr(A),
        ptr(B, 16),
        ptr(C, 16),
        ptr(D),
        ptr(s0, 16),
        ptr(y, 4),
        ptr(sf, 16),
        Int32(length),
        *(Int32(v) for v in strides),
        Int32(x.shape[0]),
        Int32(x.shape[2]),
        Int32(heads_per_group),
        cuda.CUstream(stream),
    )


def compile_scan(scan: ChunkScan, args: tuple, options: str = ""):
    """Compile ``scan`` for example :func:`launch_args` (the compiled function takes the same arguments)."""
    return cute.compile(scan, *args, options=options)
