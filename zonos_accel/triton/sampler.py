"""The engine's per-row sampling (:func:`zonos.ops.sampler.sample_rows`) as one launch.

The reference runs 66 small kernels per decode step (79 with the unified sampler and greedy rows: torch ops counted
by the profiler) for one token per (row, codebook): the noise keys' and the noise's integer hashes, the repetition
penalty's scatter, the softmax, each filter gated row by row, the race's division and argmax. Here one program per
(row, codebook) does all of it on its row of logits in registers: the same hashes (bit for bit: 64-bit integer
arithmetic masked to 32 bits, as the reference computes them), the same formulas in the same order, so the tokens
are the reference's wherever float rounding of the softmax sums does not reorder two candidates
(tests/test_sampler.py compares them on fresh logits).

The sort-based filters (top-p, top-k) are not fused: a batch in which a row uses one runs the reference.

:func:`finish_rows`, the step's EOS bookkeeping and column write (30 torch ops), is one program per slot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zonos.codebook_pattern import UNKNOWN
from zonos.ops import sampler as reference


@triton.jit
def _mix32(x):
    """:func:`zonos.ops.sampler._mix32` on uint64 values in [0, 2^32): products wrap modulo 2^64 (unsigned, so no
    overflow), the mask keeps the low 32 bits, which are the reference's."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _sample_kernel(
    logits, out, temperature, linear, conf, quad, min_p, penalty, recent, valid, seeds, steps,
    n_codebooks, vocab, window,
    s_lr, s_lq, s_rr, s_rq, s_vr, s_or,
    BLOCK: tl.constexpr, PENALTY: tl.constexpr, GREEDY: tl.constexpr, UNIFIED: tl.constexpr, MIN_P: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    q = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    inside = offs < vocab
    x = tl.load(logits + r * s_lr + q * s_lq + offs, mask=inside, other=float("-inf")).to(tl.float32)
    if PENALTY:
        p = tl.load(penalty + r)
        factors = tl.full([BLOCK], 1.0, tl.float32)
        for j in range(window):
            token = tl.load(recent + r * s_rr + q * s_rq + j)
            token = tl.minimum(tl.maximum(token, 0), vocab - 1)  # idle slots hold UNKNOWN (-1)
            factor = tl.where(tl.load(valid + r * s_vr + j) != 0, p, 1.0)
            factors = tl.where(offs == token, factors * factor, factors)
        x = tl.where(x < 0, x * factors, x / factors)
    t = tl.load(temperature + r)
    sampled = t > 0
    z = x / tl.where(sampled, t, 1.0)
    e = tl.exp(z - tl.max(z, axis=0))
    e = tl.where(inside, e, 0.0)
    probs = e / tl.sum(e, axis=0)
    if UNIFIED:
        lin = tl.load(linear + r)
        logp = tl.log(tl.maximum(probs, 1e-20))
        entropy = -tl.sum(tl.where(inside, probs * logp, 0.0), axis=0)
        u = logp * (lin + entropy * tl.load(conf + r)) - logp * logp * tl.load(quad + r)
        u = tl.where(inside & (probs > 0), u, float("-inf"))  # probability-0 tokens stay out (sampling._unified)
        eu = tl.exp(u - tl.max(u, axis=0))
        eu = tl.where(inside, eu, 0.0)
        probs = tl.where(lin > 0, eu / tl.sum(eu, axis=0), probs)
    if MIN_P:
        m = tl.load(min_p + r)
        kept = tl.where(probs < m * tl.max(probs, axis=0), 0.0, probs)
        probs = tl.where(m > 0, kept / tl.sum(kept, axis=0), probs)
    seed = tl.load(seeds + r).to(tl.uint64)  # non-negative int64s: the same bits
    step = tl.load(steps + r).to(tl.uint64)
    key = _mix32(_mix32(_mix32(seed & 0xFFFFFFFF) ^ ((seed >> 32) & 0xFFFFFFFF)) ^ (step & 0xFFFFFFFF))
    index = (q * vocab + offs).to(tl.uint64)
    h = _mix32(_mix32(index) ^ key)
    uniform = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    race = -tl.log(uniform)
    token = tl.argmax(tl.where(inside, probs / race, -1.0), axis=0)
    if GREEDY:
        token = tl.where(sampled, token, tl.argmax(x, axis=0))
    tl.store(out + r * s_or + q, token.to(tl.int64))


def sample_rows(
    logits: torch.Tensor,
    p: reference.RowParams,
    recent: torch.Tensor,
    recent_valid: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    use: tuple[bool, ...],
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.sampler.sample_rows` (float32 logits; other dtypes and batches using top-p
    or top-k run the reference)."""
    penalty, greedy, unified, top_p, top_k, min_p = use
    if top_p or top_k or logits.dtype != torch.float32:
        return reference.sample_rows(logits, p, recent, recent_valid, seeds, steps, use)
    n, q, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    recent, valid = recent.contiguous(), recent_valid.contiguous()
    out = torch.empty(n, q, dtype=torch.int64, device=logits.device)
    _sample_kernel[(n, q)](
        logits, out, p.temperature, p.linear, p.conf, p.quad, p.min_p, p.penalty, recent, valid,
        seeds.contiguous(), steps.contiguous(), q, vocab, recent.shape[-1],
        logits.stride(0), logits.stride(1), recent.stride(0), recent.stride(1), valid.stride(0), out.stride(0),
        BLOCK=triton.next_power_of_2(vocab), PENALTY=penalty, GREEDY=greedy, UNIFIED=unified, MIN_P=min_p,
        num_warps=4,
    )  # fmt: skip
    return out


@triton.jit
def _finish_kernel(
    tokens, active, delayed, offset, limit, remaining, stopping, steps, active_out,
    columns, eos_id, masked_id, unknown,
    s_t, s_dr, s_dq,
    Q: tl.constexpr, BLOCK_Q: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    q = tl.arange(0, BLOCK_Q)
    inside = q < Q
    token = tl.load(tokens + r * s_t + q, mask=inside, other=0)
    runs = tl.load(active + r) != 0
    left = tl.load(remaining + r)
    was_stopping = tl.load(stopping + r) != 0
    at = tl.load(offset + r)
    eos = tl.load(tokens + r * s_t) == eos_id
    left = tl.where(eos, tl.minimum(left, Q), left)
    now_stopping = was_stopping | eos
    eos_codebook = tl.minimum(Q - left, Q - 1)
    token = tl.where(now_stopping & (q < eos_codebook), masked_id, token)
    token = tl.where(now_stopping & (q == eos_codebook), eos_id, token)
    left = tl.where(runs, left - 1, tl.load(remaining + r))
    tl.store(remaining + r, left)
    tl.store(stopping + r, tl.where(runs, now_stopping, was_stopping))
    column = tl.minimum(at + 1, columns - 1)
    cell = delayed + r * s_dr + q * s_dq + column
    existing = tl.load(cell, mask=inside, other=0)
    tl.store(cell, tl.where(runs & (existing == unknown), token, existing), mask=inside)
    at = at + runs.to(tl.int64)
    tl.store(offset + r, at)
    tl.store(steps + r, tl.load(steps + r) + runs.to(tl.int64))
    tl.store(active_out + r, (left > 0) & (at < tl.load(limit + r)))


def finish_rows(
    tokens: torch.Tensor,
    active: torch.Tensor,
    delayed: torch.Tensor,
    offset: torch.Tensor,
    limit: torch.Tensor,
    remaining: torch.Tensor,
    stopping: torch.Tensor,
    steps: torch.Tensor,
    active_out: torch.Tensor,
    eos_token_id: int,
    masked_token_id: int,
) -> None:
    """Same contract as :func:`zonos.ops.sampler.finish_rows` (the per-slot buffers contiguous, as the slots keep
    them)."""
    n, q = tokens.shape
    for t in (offset, limit, remaining, stopping, steps, active_out, active):
        if t.dim() != 1 or t.stride(0) != 1:
            return reference.finish_rows(
                tokens, active, delayed, offset, limit, remaining, stopping, steps, active_out, eos_token_id,
                masked_token_id,
            )  # fmt: skip
    if delayed.stride(-1) != 1:
        raise ValueError("finish_rows needs the delayed codes' columns contiguous")
    tokens = tokens.contiguous()
    _finish_kernel[(n,)](
        tokens, active, delayed, offset, limit, remaining, stopping, steps, active_out,
        delayed.shape[-1], eos_token_id, masked_token_id, UNKNOWN,
        tokens.stride(0), delayed.stride(0), delayed.stride(1),
        Q=q, BLOCK_Q=triton.next_power_of_2(q), num_warps=1,
    )  # fmt: skip
