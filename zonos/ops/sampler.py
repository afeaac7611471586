"""Sampling for a batch of requests, each row with its own parameters and its own random stream.

:func:`zonos.sampling.sample_tokens` samples a batch that shares one :class:`~zonos.sampling.SamplingParams`
and one ``torch.Generator``. The engine's slots hold unrelated requests, so here every parameter is a
per-row tensor and a row's noise depends only on its request's seed and step: a request samples exactly the
same tokens alone or beside others. Each filter is applied row by row through ``torch.where``, so a row whose
request does not use a filter keeps its values bit for bit whatever its neighbours use; a batch computes only
the filters some row uses (:func:`features`), and a captured graph is keyed by that choice.

The noise is a counter-based hash (a 32-bit integer mixer applied to seed, step and element index): no
generator state, so a CUDA graph replays it without registering generators, and the draw of step ``t`` does
not depend on how many draws came before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from zonos.codebook_pattern import UNKNOWN
from zonos.sampling import SamplingParams

_M32 = 0xFFFFFFFF
FEATURES = ("penalty", "greedy", "unified", "top_p", "top_k", "min_p")


def features(params: Sequence[SamplingParams]) -> tuple[bool, ...]:
    """Which filters (in :data:`FEATURES` order) at least one of these requests uses."""
    return (
        any(p.repetition_penalty != 1.0 for p in params),
        any(p.temperature == 0 for p in params),
        any(p.linear > 0 for p in params),
        any(p.top_p > 0 for p in params),
        any(p.top_k > 0 for p in params),
        any(p.min_p > 0 for p in params),
    )


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer mixer (xor-shift-multiply) on int64 tensors holding values in [0, 2^32).

    Products overflow int64 and wrap; the low 32 bits that the mask keeps are exact either way."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def noise_keys(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row (int64) from its 63-bit seed and its step."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    return _mix32(_mix32(_mix32(lo) ^ hi) ^ (steps & _M32))


_INDEX_HASHES: dict[tuple, torch.Tensor] = {}  # element index -> its hash, per (size, device): a constant table
_INDICES: dict[tuple, torch.Tensor] = {}  # arange(size), per (size, device): a constant table


def exponential_noise(keys: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """Exp(1) draws (rows, *shape) for the exponential race, element ``e`` of row ``r`` a function of ``keys[r]``
    and ``e`` only. Uniforms have 24 bits, strictly inside (0, 1)."""
    n = shape[0] * shape[1]
    index = _INDEX_HASHES.get((n, keys.device))
    if index is None:
        index = _INDEX_HASHES[(n, keys.device)] = _mix32(torch.arange(n, device=keys.device, dtype=torch.int64))
    h = _mix32(index ^ keys[:, None])
    uniform = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return (-torch.log(uniform)).to(dtype).view(-1, *shape)


@dataclass
class RowParams:
    """Per-row sampling parameters as device tensors of ``rows`` entries (fixed addresses: a captured step reads
    them, and a request joining a slot writes its row in place)."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor
    linear: torch.Tensor
    conf: torch.Tensor
    quad: torch.Tensor
    penalty: torch.Tensor
    window: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, device: torch.device) -> RowParams:
        f = dict(device=device, dtype=torch.float32)
        i = dict(device=device, dtype=torch.int64)
        return cls(
            temperature=torch.ones(rows, **f),
            top_p=torch.zeros(rows, **f),
            top_k=torch.zeros(rows, **i),
            min_p=torch.zeros(rows, **f),
            linear=torch.zeros(rows, **f),
            conf=torch.zeros(rows, **f),
            quad=torch.zeros(rows, **f),
            penalty=torch.ones(rows, **f),
            window=torch.ones(rows, **i),
        )

    _FLOATS = ("temperature", "top_p", "min_p", "linear", "conf", "quad", "penalty")
    _INTS = ("top_k", "window")

    def set_row(self, row: int, p: SamplingParams) -> None:
        """Write request parameters ``p`` into row ``row``."""
        self.set_rows([row], [p])

    def set_rows(self, rows: Sequence[int], params: Sequence[SamplingParams]) -> None:
        """Write ``params[k]`` into row ``rows[k]`` (one host transfer per dtype, then device-side copies: writing
        device tensors element by element from Python would make the host wait for the GPU at every element)."""
        device = self.temperature.device
        floats = to_device([[p.temperature, p.top_p, p.min_p, p.linear, p.conf, p.quad, p.repetition_penalty]
                            for p in params], torch.float32, device)  # fmt: skip
        ints = to_device([[p.top_k, p.repetition_penalty_window, row] for p, row in zip(params, rows)], torch.int64,
                         device)  # fmt: skip
        index = ints[:, 2]
        for k, name in enumerate(self._FLOATS):
            getattr(self, name).index_copy_(0, index, floats[:, k])
        for k, name in enumerate(self._INTS):
            getattr(self, name).index_copy_(0, index, ints[:, k])

    def head(self, n: int) -> RowParams:
        """The first ``n`` rows (views)."""
        return RowParams(**{k: v[:n] for k, v in self.__dict__.items()})


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a tensor on ``device``, sent without making the host wait (pinned memory, non-blocking)."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _renormalize(probs: torch.Tensor) -> torch.Tensor:
    return probs / probs.sum(-1, keepdim=True)


def _column(t: torch.Tensor) -> torch.Tensor:
    return t[:, None, None]


def sample_rows(
    logits: torch.Tensor,
    p: RowParams,
    recent: torch.Tensor,
    recent_valid: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    use: tuple[bool, ...],
) -> torch.Tensor:
    """One token per (row, codebook) from float logits (n, q, V) → (n, q) int64.

    ``recent`` (n, q, w) holds each row's last w token ids, ``recent_valid`` (n, w) which of those columns fall
    inside the row's repetition window (and exist); ``seeds`` and ``steps`` (n,) int64 give the rows' noise keys
    for this step (:func:`noise_keys`); ``use`` says which filters to compute (:func:`features`). Row by row this
    equals :func:`zonos.sampling.sample_tokens` with that row's parameters and noise."""
    keys = noise_keys(seeds, steps)
    penalty, greedy, unified, top_p, top_k, min_p = use
    if penalty:
        ids = recent.clamp(0, logits.shape[-1] - 1).long()  # idle slots hold UNKNOWN (-1); their factors are 1
        factor = torch.where(recent_valid[:, None, :], _column(p.penalty), 1.0).expand(ids.shape)
        factors = torch.ones_like(logits).scatter_reduce(2, ids, factor.to(logits.dtype), "prod")
        logits = torch.where(logits < 0, logits * factors, logits / factors)
    temperature = _column(p.temperature)
    sampled_rows = temperature > 0
    probs = torch.softmax(logits / torch.where(sampled_rows, temperature, 1.0), dim=-1)
    if unified:
        logp = probs.clamp_min(1e-20).log()
        entropy = -(probs * logp).sum(-1, keepdim=True)
        scores = logp * (_column(p.linear) + entropy * _column(p.conf)) - logp.square() * _column(p.quad)
        mixed = scores.masked_fill(probs == 0, float("-inf")).softmax(-1)  # see zonos.sampling._unified
        probs = torch.where(_column(p.linear) > 0, mixed, probs)
    if top_p:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) <= _column(p.top_p)
        kept = _renormalize(probs.scatter(-1, idx, sorted_p * keep))
        probs = torch.where(_column(p.top_p) > 0, kept, probs)
    if top_k:
        k = p.top_k.clamp(1, probs.shape[-1])
        kth = probs.sort(dim=-1, descending=True).values.gather(
            -1, (k - 1)[:, None, None].expand(-1, probs.shape[1], 1)
        )
        kept = _renormalize(torch.where(probs < kth, 0.0, probs))
        probs = torch.where(_column(p.top_k) > 0, kept, probs)
    if min_p:
        kept = _renormalize(probs.masked_fill(probs < _column(p.min_p) * probs.amax(-1, keepdim=True), 0.0))
        probs = torch.where(_column(p.min_p) > 0, kept, probs)
    race = exponential_noise(keys, tuple(probs.shape[1:]), probs.dtype)
    tokens = (probs / race).argmax(-1)
    if greedy:
        tokens = torch.where(sampled_rows[:, :, 0], tokens, logits.argmax(-1))
    return tokens


def row_params_for(params: Sequence[SamplingParams], device: torch.device) -> RowParams:
    """A :class:`RowParams` of one row per request in ``params`` (for the prefills' first tokens)."""
    rows = RowParams.allocate(len(params), device)
    rows.set_rows(range(len(params)), params)
    return rows


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
    """The end of a decode step for n slots, in place on their buffers (views of their first n rows): EOS
    bookkeeping on the sampled ``tokens`` (n, 9), each active slot's column ``offset + 1`` of ``delayed``
    (n, 9, columns) written where not already written (an audio prefix's), and the slots' counters advanced.

    ``active`` (n,) says which slots this step decoded. After EOS in codebook 0, each later step writes EOS one
    codebook further (MASK before it), so all codebooks end together 9 steps later: ``remaining`` counts the steps
    left, ``stopping`` marks the slots past their EOS. ``active_out`` receives whether each slot still runs."""
    n_codebooks = tokens.shape[1]
    codebook = _INDICES.get((n_codebooks, tokens.device))
    if codebook is None:
        codebook = _INDICES[(n_codebooks, tokens.device)] = torch.arange(n_codebooks, device=tokens.device)
    eos = tokens[:, 0] == eos_token_id
    left = torch.where(eos, remaining.clamp(max=n_codebooks), remaining)
    now_stopping = stopping | eos
    eos_codebook = (n_codebooks - left).clamp(max=n_codebooks - 1)[:, None]
    ending = now_stopping[:, None]
    tokens = torch.where(ending & (codebook < eos_codebook), masked_token_id, tokens)
    tokens = torch.where(ending & (codebook == eos_codebook), eos_token_id, tokens)
    remaining.copy_(torch.where(active, left - 1, remaining))
    stopping.copy_(torch.where(active, now_stopping, stopping))
    column = (offset + 1).clamp(max=delayed.shape[-1] - 1)[:, None, None].expand(-1, n_codebooks, 1)
    existing = delayed.gather(2, column)[..., 0]
    written = torch.where(active[:, None] & (existing == UNKNOWN), tokens, existing)
    delayed.scatter_(2, column, written[..., None])
    offset.add_(active.long())
    steps.add_(active.long())
    active_out.copy_((remaining > 0) & (offset < limit))
