"""Decode attention (``zonos.ops.decode_attention``) as a split-K Triton kernel that reads only the
cache rows up to the current position.

The reference masks the whole preallocated cache (max_seqlen rows) so its shapes stay fixed for CUDA
graphs, and SDPA with a mask and GQA falls back to the math kernels, which also expand the kv heads. Here
the grid is fixed too (batch × kv heads × splits of the cache), but each program reads ``position`` from
the device and loops only over the rows at or before it, so the bytes read grow with the sequence, not
with max_seqlen. Each program handles every query head of its kv head (GQA without copies) with an
online softmax in float32; a second kernel merges the splits.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_S = 16  # cache rows per loop iteration (a 4 × 16 × 128 float32 product per program stays in registers)
CHUNK = 32  # cache rows per split. Measured on the H200 (2026-11-30, position ~130): 16 splits of 256 rows
# left one program per (sequence, kv head) looping over every row, 30 µs per layer; short splits spread the
# rows over many programs (those past the position store nothing and exit)
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
):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // kv_heads
    h = bh % kv_heads
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    g_ok = g < G
    d_ok = d < D
    last = tl.load(pos_ptr)
    start = split * chunk
    end = tl.minimum(start + chunk, last + 1)
    active = start <= last
    q = tl.load(
        q_ptr + b * stride_qb + (h * G + g)[:, None] * stride_qh + d[None, :],
        mask=active & g_ok[:, None] & d_ok[None, :],
        other=0.0,
    ).to(tl.float32)
    q = q * scale
    m = tl.full((GP,), float("-inf"), tl.float32)
    l = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, DP), tl.float32)
    for s0 in range(start, end, BLOCK):
        s = s0 + tl.arange(0, BLOCK)
        s_ok = s < end
        kv_mask = s_ok[:, None] & d_ok[None, :]
        k_rows = k_ptr + b * stride_kb + h * stride_kh + s[:, None] * stride_ks
        k = tl.load(k_rows + d[None, :], mask=kv_mask, other=0.0)
        scores = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # (GP, BLOCK)
        scores = tl.where(s_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        v_rows = v_ptr + b * stride_vb + h * stride_vh + s[:, None] * stride_vs
        v = tl.load(v_rows + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m = m_new
    row = (bh * n_splits + split) * GP + g  # partials laid out (b, kv_heads, splits, GP, ...)
    tl.store(acc_ptr + row[:, None] * DP + d[None, :], acc, mask=active)
    tl.store(ml_ptr + row * 2, m, mask=active)
    tl.store(ml_ptr + row * 2 + 1, l, mask=active)


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
    GP: tl.constexpr,
    D: tl.constexpr,
    DP: tl.constexpr,
    SB: tl.constexpr,
):
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
        row = ((b * kv_heads + h) * n_splits + sp) * GP + g
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
    gp, dp = triton.next_power_of_2(g), triton.next_power_of_2(d)
    chunk = CHUNK
    n_splits = triton.cdiv(max_seqlen, chunk)
    acc = torch.empty(b * hkv * n_splits * gp, dp, device=q.device, dtype=torch.float32)
    ml = torch.empty(b * hkv * n_splits * gp, 2, device=q.device, dtype=torch.float32)
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
        chunk,
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
        GP=gp,
        D=d,
        DP=dp,
        BLOCK=BLOCK_S,
    )
    _merge_kernel[(b * hq,)](
        acc,
        ml,
        out,
        position,
        chunk,
        n_splits,
        out.stride(0),
        out.stride(2),
        hkv,
        G=g,
        GP=gp,
        D=d,
        DP=dp,
        SB=MERGE_BLOCK,
    )
    return out
