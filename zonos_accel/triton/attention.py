"""Attention against the KV cache (``zonos.ops.decode_attention``, ``zonos.ops.prefill_attention``) as Triton
kernels that read only the cache rows up to the current position.

The references mask the whole preallocated cache (max_seqlen rows) so their shapes stay fixed for CUDA
graphs, and SDPA with a mask and GQA falls back to the math kernels, which also expand the kv heads. The
grids here are fixed too, but each program reads the position from the device and loops only over the
rows its queries see, so the bytes read grow with the sequence, not with max_seqlen.

- Decode (one token): programs over batch × kv heads × splits of the cache; each handles every query head
  of its kv head (GQA without copies: the G query heads padded to a 16-row tile) with tensor-core products
  and an online softmax in float32; a second kernel merges the splits.
- Prefill (n tokens): one program per block of query tokens of one (sequence, query head), an online
  softmax over key blocks with tensor-core products (float32 inputs in full precision, not TF32).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from zonos_accel.triton import pdl
from zonos_accel.triton.pdl import enter

# Decode tiling, chosen with benchmarks/decode_attention.py (H200, 2026-11-30; see docs/BENCHMARKS.md).
CHUNK = 128  # cache rows per split: programs past the position store nothing and exit
BLOCK_S = 64  # cache rows per loop iteration (tensor-core products of a 16-row query tile)
SPLIT_WARPS = 4  # warps per split program
MERGE_BLOCK = 16  # splits merged per loop iteration


@triton.jit
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    acc_ptr,
    ml_ptr,
    scale,
    kv_heads,
    chunk,
    n_splits,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    DP: tl.constexpr,
    BLOCK: tl.constexpr,
    PRECISION: tl.constexpr,
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
    last = tl.load(pos_ptr)
    start = split * chunk
    if start <= last:
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
        row = (bh * n_splits + split) * G + g  # partials laid out (b, kv_heads, splits, G, ...)
        tl.store(acc_ptr + row[:, None] * DP + d[None, :], acc, mask=g_ok[:, None])
        tl.store(ml_ptr + row * 2, m, mask=g_ok)
        tl.store(ml_ptr + row * 2 + 1, l, mask=g_ok)


@triton.jit
def _merge_kernel(
    acc_ptr,
    ml_ptr,
    o_ptr,
    pos_ptr,
    chunk,
    n_splits,
    stride_ob,
    stride_oh,
    kv_heads,
    G: tl.constexpr,
    D: tl.constexpr,
    DP: tl.constexpr,
    SB: tl.constexpr,
    GDC: tl.constexpr,
):
    enter(GDC)
    pid = tl.program_id(0)  # one query head of one sequence
    b = pid // (kv_heads * G)
    hq = pid % (kv_heads * G)
    h = hq // G
    g = hq % G
    d = tl.arange(0, DP)
    active = tl.load(pos_ptr) // chunk + 1  # splits that hold rows at or before the position
    m_all = tl.full((1,), float("-inf"), tl.float32)
    l_all = tl.zeros((1,), tl.float32)
    out = tl.zeros((DP,), tl.float32)
    for s0 in range(0, active, SB):
        sp = s0 + tl.arange(0, SB)
        sp_ok = sp < active
        row = ((b * kv_heads + h) * n_splits + sp) * G + g
        m = tl.load(ml_ptr + row * 2, mask=sp_ok, other=float("-inf"))
        l = tl.load(ml_ptr + row * 2 + 1, mask=sp_ok, other=0.0)
        acc = tl.load(acc_ptr + row[:, None] * DP + d[None, :], mask=sp_ok[:, None], other=0.0)
        m_new = tl.maximum(m_all, tl.max(m, axis=0))
        w = tl.where(sp_ok, tl.exp(m - m_new), 0.0)
        rescale = tl.exp(m_all - m_new)
        out = out * rescale + tl.sum(w[:, None] * acc, axis=0)
        l_all = l_all * rescale + tl.sum(w * l, axis=0)
        m_all = m_new
    tl.store(o_ptr + b * stride_ob + hq * stride_oh + d, (out / l_all).to(o_ptr.dtype.element_ty), mask=d < D)


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
    g = hq // hkv
    dp = max(16, triton.next_power_of_2(d))
    n_splits = triton.cdiv(max_seqlen, CHUNK)
    acc = torch.empty(b * hkv * n_splits * g, dp, device=q.device, dtype=torch.float32)
    ml = torch.empty(b * hkv * n_splits * g, 2, device=q.device, dtype=torch.float32)
    out = torch.empty(b, 1, hq, d, device=q.device, dtype=q.dtype)
    _split_kernel[(b * hkv, n_splits)](
        q,
        k_cache,
        v_cache,
        position,
        acc,
        ml,
        1.0 / math.sqrt(d),
        hkv,
        CHUNK,
        n_splits,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        G=g,
        GP=max(16, triton.next_power_of_2(g)),
        D=d,
        DP=dp,
        BLOCK=BLOCK_S,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=SPLIT_WARPS,
        **pdl.options(q.device),
    )
    _merge_kernel[(b * hq,)](
        acc,
        ml,
        out,
        position,
        CHUNK,
        n_splits,
        out.stride(0),
        out.stride(2),
        hkv,
        G=g,
        D=d,
        DP=dp,
        SB=MERGE_BLOCK,
        **pdl.options(q.device),
    )
    return out


# Prefill runs a few times per request, so fixed tiles rather than autotuning.
PREFILL_BLOCK_N = 64  # key rows per loop iteration
PREFILL_MAX_BLOCK_M = 64  # query tokens per program (fewer for short pieces, at least a 16-row tile)


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
    GDC: tl.constexpr,
):
    enter(GDC)
    block = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // heads
    hq = bh % heads
    hk = hq // group
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
    end = first + tl.minimum(n, (block + 1) * BLOCK_M)  # rows any real query of the block sees: [0, end)
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
    hkv = k_cache.shape[2]
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("prefill_attention needs caches contiguous in the head dimension")
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
        **pdl.options(q.device),
    )
    return out
