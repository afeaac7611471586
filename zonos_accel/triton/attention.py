"""Attention against the KV cache (``zonos.ops.decode_attention``, ``zonos.ops.prefill_attention``) as Triton
kernels that read only the cache rows up to the current position.

The references mask the whole preallocated cache (max_seqlen rows) so their shapes stay fixed for CUDA
graphs, and SDPA with a mask and GQA falls back to the math kernels, which also expand the kv heads. The
grids here are fixed too, but each program reads the position from the device and loops only over the
rows its queries see, so the bytes read grow with the sequence, not with max_seqlen.

The position is a device scalar shared by the batch or one per row, (b,) (the engine's slots sit at different
positions); the ``PER_ROW`` constexpr picks which, so a shared position costs no per-row address arithmetic
(sm_90 PTX: the per-row form adds one multiply-add). A row's programs depend on nothing but that row, so a
batch gives, row for row, bit for bit what each row gives alone. Positions at or past max_seqlen are clamped
to the last row, which is what the references' masks do with them (every row visible): nothing is read or
written outside the cache, and the split counters return to zero. Negative positions are the caller's
error: no access is out of bounds, but the output is unspecified (the references give NaN).

- Decode (one token): programs over batch × kv heads × splits of the cache; each handles every query head
  of its kv head (GQA without copies: the G query heads padded to a 16-row tile) with tensor-core products
  and an online softmax in float32; the split that finishes last merges the partials of all (one launch).
- Prefill (n tokens): one program per block of query tokens of one (sequence, query head), an online
  softmax over key blocks with tensor-core products (float32 inputs in full precision, not TF32).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from zonos.errors import ZonosInputError
from zonos_accel.triton import pdl
from zonos_accel.triton.pdl import enter

# Tiling of both kernels, in one place (H200; docs/BENCHMARKS.md, decisions: CHUNK).  Decode, swept with
# benchmarks/decode_attention.py: 128-row splits take 5.7 / 6.2 / 8.7 us at positions 226 / 1000 / 2700, close to
# the best of 64, 128 and 256 at each (SDPA over the masked cache: 17-18 us); 32-row loop steps 6.7 / 7.1 / 10.4.
CHUNK = 128  # cache rows per split: programs past the position store nothing and exit
BLOCK_S = 64  # cache rows per loop iteration (tensor-core products of a 16-row query tile)
SPLIT_WARPS = 4  # warps per split program
# Prefill runs a few times per request, so fixed tiles rather than autotuning (not swept).
PREFILL_BLOCK_N = 64  # key rows per loop iteration
PREFILL_MAX_BLOCK_M = 64  # query tokens per program (fewer for short pieces, at least a 16-row tile)


@triton.jit
def _decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    o_ptr,
    acc_ptr,
    ml_ptr,
    count_ptr,
    scale,
    kv_heads,
    chunk,
    n_splits,
    max_seqlen,
    stride_pb,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_oh,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    DP: tl.constexpr,
    BLOCK: tl.constexpr,
    PRECISION: tl.constexpr,
    PER_ROW: tl.constexpr,
    GDC: tl.constexpr,
):
    enter(GDC)
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // kv_heads
    h = bh % kv_heads
    g = tl.arange(0, GP)  # the kv head's G query heads, padded to a tensor-core tile
    d = tl.arange(0, DP)
    g_ok = g < G
    d_ok = d < D
    if PER_ROW:
        pos_ptr += b * stride_pb
    # Clamped: past the cache, every row is visible (as in the reference) and every split is in the grid, so the
    # merging split still arrives and resets the row's counter.
    last = tl.minimum(tl.load(pos_ptr), max_seqlen - 1)
    active = last // chunk + 1  # splits that hold rows at or before the position; the others exit
    start = split * chunk
    if split < active:
        end = tl.minimum(start + chunk, last + 1)
        q = tl.load(
            q_ptr + b * stride_qb + (h * G + g)[:, None] * stride_qh + d[None, :],
            mask=g_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        m = tl.full((GP,), float("-inf"), tl.float32)
        l = tl.zeros((GP,), tl.float32)
        acc = tl.zeros((GP, DP), tl.float32)
        for s0 in range(start, end, BLOCK):
            s = s0 + tl.arange(0, BLOCK)
            s_ok = s < end
            kv_mask = s_ok[:, None] & d_ok[None, :]
            k_rows = k_ptr + b * stride_kb + h * stride_kh + s[:, None] * stride_ks
            k = tl.load(k_rows + d[None, :], mask=kv_mask, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (GP, BLOCK) in float32
            scores = tl.where(s_ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m - m_new)
            l = l * alpha + tl.sum(p, axis=1)
            v_rows = v_ptr + b * stride_vb + h * stride_vh + s[:, None] * stride_vs
            v = tl.load(v_rows + d[None, :], mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m = m_new
        o_rows = o_ptr + b * stride_ob + (h * G + g)[:, None] * stride_oh + d[None, :]
        o_mask = g_ok[:, None] & d_ok[None, :]
        if active == 1:
            tl.store(o_rows, (acc / l[:, None]).to(o_ptr.dtype.element_ty), mask=o_mask)
        else:
            # Split-K: publish this split's partials, then the split that arrives last merges them all (one
            # launch instead of a second merge kernel). The atomic orders the partial stores before the count
            # (release) and the last split's count before its loads (acquire); it resets the count for the
            # next call. The barrier puts every warp's stores before the count, which one thread makes.
            row = (bh * n_splits + split) * G + g  # partials laid out (b, kv_heads, splits, G, ...)
            tl.store(acc_ptr + row[:, None] * DP + d[None, :], acc, mask=g_ok[:, None])
            tl.store(ml_ptr + row * 2, m, mask=g_ok)
            tl.store(ml_ptr + row * 2 + 1, l, mask=g_ok)
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + bh, 1, sem="acq_rel", scope="gpu")
            if arrived == active - 1:
                m_all = tl.full((GP,), float("-inf"), tl.float32)
                l_all = tl.zeros((GP,), tl.float32)
                out = tl.zeros((GP, DP), tl.float32)
                for sp in range(0, active):  # in split order, whichever split merges
                    srow = (bh * n_splits + sp) * G + g
                    m_s = tl.load(ml_ptr + srow * 2, mask=g_ok, other=0.0, cache_modifier=".cg")
                    l_s = tl.load(ml_ptr + srow * 2 + 1, mask=g_ok, other=0.0, cache_modifier=".cg")
                    acc_s = tl.load(
                        acc_ptr + srow[:, None] * DP + d[None, :], mask=g_ok[:, None], other=0.0, cache_modifier=".cg"
                    )
                    m_new = tl.maximum(m_all, m_s)
                    rescale = tl.exp(m_all - m_new)
                    w = tl.exp(m_s - m_new)
                    out = out * rescale[:, None] + w[:, None] * acc_s
                    l_all = l_all * rescale + w * l_s
                    m_all = m_new
                tl.store(o_rows, (out / l_all[:, None]).to(o_ptr.dtype.element_ty), mask=o_mask)
                tl.atomic_xchg(count_ptr + bh, 0, sem="relaxed", scope="gpu")


# Split counters of the decode kernel, one per (batch row, kv head) of a KV cache (so models decoding
# concurrently on one device never share one). Each counts the arrivals of its own row's splits against that
# row's own position, so rows at different positions never mix. Zero between calls (the merging split resets
# its own). Never freed: CUDA graphs captured earlier keep their addresses, and a graph holds no reference, so
# a set outgrown by a larger batch stays in _outgrown. The first set covers COUNTER_ROWS rows, so slot buckets
# up to that batch on one cache (views of it share its address) all use one set.
COUNTER_ROWS = 512
_counters: dict[tuple[torch.device, int], torch.Tensor] = {}
_outgrown: list[torch.Tensor] = []


def _split_counters(k_cache: torch.Tensor, rows: int, kv_heads: int) -> torch.Tensor:
    key = (k_cache.device, k_cache.data_ptr())
    counters = _counters.get(key)
    if counters is None or counters.numel() < rows * kv_heads:
        if counters is not None:
            _outgrown.append(counters)
        counters = torch.zeros(max(rows, COUNTER_ROWS) * kv_heads, device=k_cache.device, dtype=torch.int32)
        _counters[key] = counters
    return counters


def _row_positions(position: torch.Tensor, b: int, op: str) -> tuple[int, bool]:
    """(row stride, per row?) of an attention op's ``position``: a device scalar shared by the batch, or (b,)."""
    if position.numel() == 1:
        return 0, False  # also a (1,) position of a one-row batch: the shared form's kernel
    if position.shape != (b,):
        raise ZonosInputError(
            f"{op}: position has shape {tuple(position.shape)}; pass a device scalar shared by the batch "
            f"or one position per row, shape ({b},)"
        )
    return position.stride(0), True


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.attention.decode_attention` (the reference it is tested against)."""
    b, _, hq, d = q.shape
    _, max_seqlen, hkv, _ = k_cache.shape
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("decode_attention needs caches contiguous in the head dimension")
    q = q[:, 0]
    if q.stride(-1) != 1:
        q = q.contiguous()
    stride_pb, per_row = _row_positions(position, b, "decode_attention")
    g = hq // hkv
    dp = max(16, triton.next_power_of_2(d))
    n_splits = triton.cdiv(max_seqlen, CHUNK)
    acc = torch.empty(b * hkv * n_splits * g, dp, device=q.device, dtype=torch.float32)
    ml = torch.empty(b * hkv * n_splits * g, 2, device=q.device, dtype=torch.float32)
    out = torch.empty(b, 1, hq, d, device=q.device, dtype=q.dtype)
    _decode_kernel[(b * hkv, n_splits)](
        q,
        k_cache,
        v_cache,
        position,
        out,
        acc,
        ml,
        _split_counters(k_cache, b, hkv),
        1.0 / math.sqrt(d),
        hkv,
        CHUNK,
        n_splits,
        max_seqlen,
        stride_pb,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(2),
        G=g,
        GP=max(16, triton.next_power_of_2(g)),
        D=d,
        DP=dp,
        BLOCK=BLOCK_S,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        PER_ROW=per_row,
        num_warps=SPLIT_WARPS,
        **pdl.options(q.device),
    )
    return out


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    pos_ptr,
    scale,
    n,
    heads,
    group,
    max_seqlen,
    stride_pb,
    stride_qb,
    stride_ql,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_ol,
    stride_oh,
    D: tl.constexpr,
    DP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    PER_ROW: tl.constexpr,
    GDC: tl.constexpr,
):
    enter(GDC)
    block = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // heads
    hq = bh % heads
    hk = hq // group
    if PER_ROW:
        pos_ptr += b * stride_pb
    first = tl.load(pos_ptr)  # cache row of the piece's first token
    i = block * BLOCK_M + tl.arange(0, BLOCK_M)  # query tokens of this program, within the piece
    d = tl.arange(0, DP)
    i_ok = i < n
    d_ok = d < D
    q = tl.load(
        q_ptr + b * stride_qb + i[:, None] * stride_ql + hq * stride_qh + d[None, :],
        mask=i_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    last = first + i  # query i sees rows 0 .. first + i
    # Rows any real query of the block sees: [0, end), within the cache (a query past it sees every row).
    end = tl.minimum(first + tl.minimum(n, (block + 1) * BLOCK_M), max_seqlen)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, DP), tl.float32)
    for s0 in range(0, end, BLOCK_N):
        s = s0 + tl.arange(0, BLOCK_N)
        s_ok = s < end
        kv_mask = s_ok[:, None] & d_ok[None, :]
        k_rows = k_ptr + b * stride_kb + s[:, None] * stride_ks + hk * stride_kh
        k = tl.load(k_rows + d[None, :], mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BLOCK_M, BLOCK_N) in float32
        # Row 0 is visible to every query (padding queries past n included), so no row is all -inf.
        scores = tl.where((s[None, :] <= last[:, None]) & s_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        v_rows = v_ptr + b * stride_vb + s[:, None] * stride_vs + hk * stride_vh
        v = tl.load(v_rows + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    out = acc / l[:, None]
    o_rows = o_ptr + b * stride_ob + i[:, None] * stride_ol + hq * stride_oh + d[None, :]
    tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=i_ok[:, None] & d_ok[None, :])


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.attention.prefill_attention` (the reference it is tested against)."""
    b, n, hq, d = q.shape
    _, max_seqlen, hkv, _ = k_cache.shape
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("prefill_attention needs caches contiguous in the head dimension")
    stride_pb, per_row = _row_positions(position, b, "prefill_attention")
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(b, n, hq, d, device=q.device, dtype=q.dtype)
    block_m = min(PREFILL_MAX_BLOCK_M, max(16, triton.next_power_of_2(n)))
    _prefill_kernel[(triton.cdiv(n, block_m), b * hq)](
        q,
        k_cache,
        v_cache,
        out,
        position,
        1.0 / math.sqrt(d),
        n,
        hq,
        hq // hkv,
        max_seqlen,
        stride_pb,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        D=d,
        DP=max(16, triton.next_power_of_2(d)),
        BLOCK_M=block_m,
        BLOCK_N=PREFILL_BLOCK_N,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        PER_ROW=per_row,
        **pdl.options(q.device),
    )
    return out
