"""Token sampling as upstream Zonos offers it: temperature, top-p, top-k, min-p, NovelAI's unified
sampler (linear / conf / quad), and a windowed repetition penalty.

Everything is tensor-only (no host synchronization), so a decode step with sampling can be captured in a
CUDA graph. Sampling draws with the exponential-race trick (argmax of p / Exp(1)), which equals a
multinomial draw and takes an optional ``torch.Generator`` for reproducibility.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from zonos.errors import ZonosInputError
from zonos.validation import check_int, check_real


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
    def from_dict(cls, params: Mapping[str, Any] | None) -> SamplingParams:
        """Validate a ``sampling_params`` dict (as passed to ``generate``).

        Every value must be a finite real number in its range (integers for ``top_k`` and
        ``repetition_penalty_window``); bools, strings, NaN and infinities raise :class:`ZonosInputError`.
        """
        if params is not None and not isinstance(params, Mapping):
            raise ZonosInputError(
                f"sampling_params must be a dict such as {{'min_p': 0.1}}, got {type(params).__name__}"
            )
        params = dict(params or {})
        known = {f.name for f in fields(cls)}
        unknown = set(params) - known
        if unknown:
            raise ZonosInputError(f"unknown sampling parameter(s) {sorted(map(str, unknown))}; known: {sorted(known)}")
        checked = {
            name: (
                check_int(name, value, lo, hi, allow_integral_float=True, hint=hint)
                if name in _INTEGER_FIELDS
                else check_real(name, value, lo, hi, lo_open=lo_open, hint=hint)
            )
            for name, value in params.items()
            for lo, hi, lo_open, hint in (_RANGES[name],)
        }
        return cls(**checked)


# Beyond these the float32 sampling arithmetic overflows (a temperature past 3.4e38 is infinite and turns the logits
# into NaN; a unified weight of 1e38 times log(1e-20) is -inf for every token): the draws came out all zero. Values
# this large carry no meaning anyway: a temperature of 1e6 is already a uniform draw.
MAX_SAMPLING_WEIGHT = 1e6
MAX_TOP_K = 2**31 - 1  # any k from the vocabulary size up keeps every token

# name: (low, high, low end open, what the value means)
_RANGES: dict[str, tuple[float | None, float | None, bool, str]] = {
    "temperature": (0.0, MAX_SAMPLING_WEIGHT, False, "0 means greedy, 1 the model's distribution"),
    "top_p": (0.0, 1.0, False, "0 disables it"),
    "top_k": (0, MAX_TOP_K, False, "0 disables it"),
    "min_p": (0.0, 1.0, False, "0 disables it"),
    "linear": (-MAX_SAMPLING_WEIGHT, MAX_SAMPLING_WEIGHT, False,
               "the unified sampler's linear term; 0 or less disables the unified sampler"),
    "conf": (-MAX_SAMPLING_WEIGHT, MAX_SAMPLING_WEIGHT, False, "the unified sampler's entropy term"),
    "quad": (-MAX_SAMPLING_WEIGHT, MAX_SAMPLING_WEIGHT, False, "the unified sampler's quadratic term"),
    "repetition_penalty": (0.0, MAX_SAMPLING_WEIGHT, True, "1 disables it; upstream's default is 3"),
    "repetition_penalty_window": (1, MAX_TOP_K, False, "how many recent frames the penalty looks at"),
}  # fmt: skip
_INTEGER_FIELDS = frozenset({"top_k", "repetition_penalty_window"})


def apply_repetition_penalty(logits: torch.Tensor, recent: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide positive logits (multiply negative ones) by ``penalty`` once per occurrence in ``recent``.

    logits (b, n_q, V), recent (b, n_q, w) token ids; ids ≥ V are clamped to V - 1 as upstream does.
    """
    recent = recent.clamp(max=logits.shape[-1] - 1).long()
    factors = torch.ones_like(logits).scatter_reduce(
        2, recent, torch.full_like(recent, penalty, dtype=logits.dtype), "prod"
    )
    return torch.where(logits < 0, logits * factors, logits / factors)  # 0 stays 0 if a factor overflows


def _finite_top(logits: torch.Tensor) -> torch.Tensor:
    """+inf logits (a tiny temperature or a penalty factor that underflowed to 0) become the dtype's largest
    value, so softmax gives them all the mass instead of NaN; -inf (masked columns) stays."""
    return torch.nan_to_num(logits, posinf=torch.finfo(logits.dtype).max, neginf=float("-inf"))


def _unified(probs: torch.Tensor, linear: float, conf: float, quad: float) -> torch.Tensor:
    """NovelAI's unified sampler. Tokens of probability 0 (masked, or underflowed) stay at 0: upstream scores them
    as log(1e-20), which a negative weight (``linear + entropy * conf < 0``, or ``quad < 0``) turns into the
    best score, so the masked pad and EOS ids won every draw and the codes came out all zero."""
    logp = probs.clamp_min(1e-20).log()
    entropy = -(probs * logp).sum(-1, keepdim=True)
    scores = logp * (linear + entropy * conf) - logp.square() * quad
    return scores.masked_fill(probs == 0, float("-inf")).softmax(-1)


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
    probs = torch.softmax(_finite_top(logits / params.temperature), dim=-1)
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
