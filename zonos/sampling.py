"""Token sampling as upstream Zonos offers it: temperature, top-p, top-k, min-p, NovelAI's unified
sampler (linear / conf / quad), and a windowed repetition penalty.

Everything is tensor-only (no host synchronization), so a decode step with sampling can be captured in a
CUDA graph. Sampling draws with the exponential-race trick (argmax of p / Exp(1)), which equals a
multinomial draw and takes an optional ``torch.Generator`` for reproducibility.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Upstream's ``sample_from_logits`` keyword arguments and defaults."""

    temperature: float = 1.0
    top_p: float = 0.0
    top_k: int = 0
    min_p: float = 0.0
    linear: float = 0.0
    conf: float = 0.0
    quad: float = 0.0
    repetition_penalty: float = 3.0
    repetition_penalty_window: int = 2

    @classmethod
    def from_dict(cls, params: dict | None) -> SamplingParams:
        """Validate a ``sampling_params`` dict (as passed to ``generate``)."""
        params = dict(params or {})
        known = {f.name for f in fields(cls)}
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {sorted(unknown)}; known: {sorted(known)}")
        p = cls(**params)
        if p.temperature < 0:
            raise ValueError(f"temperature must be ≥ 0 (0 means greedy), got {p.temperature}")
        if not 0 <= p.top_p <= 1 or not 0 <= p.min_p <= 1:
            raise ValueError(
                f"top_p and min_p must lie in [0, 1] (0 disables them), got top_p={p.top_p}, min_p={p.min_p}"
            )
        if p.top_k < 0 or int(p.top_k) != p.top_k:
            raise ValueError(f"top_k must be a non-negative integer (0 disables it), got {p.top_k}")
        if p.repetition_penalty <= 0 or p.repetition_penalty_window < 1:
            raise ValueError(
                "repetition_penalty must be > 0 (1 disables it) and repetition_penalty_window ≥ 1, got "
                f"repetition_penalty={p.repetition_penalty}, repetition_penalty_window={p.repetition_penalty_window}"
            )
        return p


def apply_repetition_penalty(logits: torch.Tensor, recent: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide positive logits (multiply negative ones) by ``penalty`` once per occurrence in ``recent``.

    logits (b, n_q, V), recent (b, n_q, w) token ids; ids ≥ V are clamped to V - 1 as upstream does.
    """
    recent = recent.clamp(max=logits.shape[-1] - 1).long()
    factors = torch.ones_like(logits).scatter_reduce(
        2, recent, torch.full_like(recent, penalty, dtype=logits.dtype), "prod"
    )
    return torch.where(logits <= 0, logits * factors, logits / factors)


def _unified(probs: torch.Tensor, linear: float, conf: float, quad: float) -> torch.Tensor:
    logp = probs.clamp_min(1e-20).log()
    entropy = -(probs * logp).sum(-1, keepdim=True)
    return (logp * (linear + entropy * conf) - logp.square() * quad).softmax(-1)


def _renormalize(probs: torch.Tensor) -> torch.Tensor:
    return probs / probs.sum(-1, keepdim=True)


def _top_p(probs: torch.Tensor, p: float) -> torch.Tensor:
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) <= p  # keep the smallest prefix reaching mass p
    return _renormalize(probs.scatter(-1, idx, sorted_p * keep))


def _top_k(probs: torch.Tensor, k: int) -> torch.Tensor:
    kth = probs.topk(min(k, probs.shape[-1]), dim=-1).values[..., -1:]
    return _renormalize(torch.where(probs < kth, 0.0, probs))


def _min_p(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    return _renormalize(probs.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), 0.0))


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams = SamplingParams(),
    recent_tokens: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Sample one token per (batch, codebook) from logits (b, n_q, V) → (b, n_q, 1) int64.

    ``recent_tokens`` (b, n_q, ≥ window) are the tokens already generated; the repetition penalty uses
    the last ``params.repetition_penalty_window`` of them.
    """
    if params.repetition_penalty != 1.0 and recent_tokens is not None:
        window = recent_tokens[..., -params.repetition_penalty_window :]
        logits = apply_repetition_penalty(logits, window, params.repetition_penalty)
    if params.temperature == 0:
        return logits.argmax(-1, keepdim=True)
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.linear > 0:
        probs = _unified(probs, params.linear, params.conf, params.quad)
    if params.top_p > 0:
        probs = _top_p(probs, params.top_p)
    if params.top_k > 0:
        probs = _top_k(probs, params.top_k)
    if params.min_p > 0:
        probs = _min_p(probs, params.min_p)
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / race).argmax(-1, keepdim=True)


def sample_from_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_p: float = 0.0,
    top_k: int = 0,
    min_p: float = 0.0,
    linear: float = 0.0,
    conf: float = 0.0,
    quad: float = 0.0,
    generated_tokens: torch.Tensor | None = None,
    repetition_penalty: float = 3.0,
    repetition_penalty_window: int = 2,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Upstream's signature: sample (b, n_q, 1) tokens from logits (b, n_q, V); see :class:`SamplingParams`."""
    params = SamplingParams(
        temperature, top_p, top_k, min_p, linear, conf, quad, repetition_penalty, repetition_penalty_window
    )
    return sample_tokens(logits, params, generated_tokens, generator)
