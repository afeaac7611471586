"""Sampling: each filter against its definition, the repetition penalty, and the draw's distribution."""

import numpy as np
import pytest
import torch

from zonos.errors import ZonosInputError
from zonos.sampling import SamplingParams, apply_repetition_penalty, sample_from_logits, sample_tokens


def _probs_after(logits, **kw):
    """Empirical distribution of 20000 draws."""
    gen = torch.Generator().manual_seed(0)
    draws = sample_from_logits(logits.expand(20000, 1, -1).clone(), generator=gen, repetition_penalty=1.0, **kw)
    return torch.bincount(draws.flatten(), minlength=logits.shape[-1]).float() / 20000


def test_draws_follow_softmax():
    logits = torch.tensor([[[1.0, 0.0, -1.0, 2.0]]])
    expected = torch.softmax(logits[0, 0], -1)
    assert (_probs_after(logits) - expected).abs().max() < 0.015


def test_temperature_top_k_top_p_min_p():
    logits = torch.tensor([[[3.0, 2.0, 1.0, 0.0, -1.0]]])
    p = torch.softmax(logits[0, 0], -1)
    assert (_probs_after(logits, top_k=2)[2:] == 0).all()
    # top_p keeps the smallest prefix whose mass reaches p (here the first two tokens: 0.665 + 0.245 ≥ 0.8).
    assert (_probs_after(logits, top_p=0.8)[2:] == 0).all() and p[0] < 0.8
    # min_p drops tokens below min_p × the top probability.
    kept = p >= 0.2 * p[0]
    assert ((_probs_after(logits, min_p=0.2) > 0) == kept).all()
    hot = _probs_after(logits, temperature=4.0)
    assert hot[-1] > 2 * p[-1]


def test_greedy_and_unified():
    logits = torch.randn(2, 9, 1026)
    greedy = sample_from_logits(logits, temperature=0, repetition_penalty=1.0)
    assert torch.equal(greedy[..., 0], logits.argmax(-1))
    u = sample_from_logits(logits, linear=0.5, conf=0.4, quad=0.0, generator=torch.Generator().manual_seed(1))
    assert u.shape == (2, 9, 1) and u.dtype == torch.long


def test_repetition_penalty_per_occurrence():
    logits = torch.tensor([[[2.0, -2.0, 1.0, 5.0]]])
    recent = torch.tensor([[[0, 1, 0, 7]]])  # 7 ≥ V clamps to the last column, as upstream
    out = apply_repetition_penalty(logits, recent, 2.0)
    assert torch.equal(out, torch.tensor([[[0.5, -4.0, 1.0, 2.5]]]))
    params = SamplingParams(temperature=0, repetition_penalty=100.0, repetition_penalty_window=1)
    # The window only looks at the last token: 0 is penalized away only when it is the newest.
    assert sample_tokens(torch.tensor([[[3.0, 2.9]]]), params, torch.tensor([[[0, 1]]])).item() == 0
    assert sample_tokens(torch.tensor([[[3.0, 2.9]]]), params, torch.tensor([[[1, 0]]])).item() == 1


@pytest.mark.parametrize(
    "bad", [{"temperature": -1}, {"top_p": 2}, {"top_k": 1.5}, {"repetition_penalty_window": 0}, {"nucleus": 1}]
)
def test_bad_params(bad):
    with pytest.raises(ValueError):
        SamplingParams.from_dict(bad)


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty must be a finite number"),
        ({"conf": float("nan")}, "conf must be a finite number"),
        ({"quad": float("nan")}, "quad must be a finite number"),
        ({"linear": float("-inf")}, "linear must be a finite number"),
        ({"top_k": float("nan")}, "top_k must be an integer"),
        ({"repetition_penalty_window": 2.5}, "repetition_penalty_window must be an integer"),
        ({"temperature": "0.7"}, "temperature must be a real number, got '0.7'"),
        ({"min_p": True}, "min_p must be a real number"),
        ({"top_k": True}, "top_k must be an integer, got the bool True"),
        ({"top_p": None}, "top_p must be a real number, got None"),
        ({"repetition_penalty": 0}, r"repetition_penalty must lie in \(0, 1e\+06\]"),
    ],
)
def test_non_finite_and_wrongly_typed_params_are_input_errors(bad, pattern):
    with pytest.raises(ZonosInputError, match=pattern):
        SamplingParams.from_dict(bad)


def test_from_dict_normalises_numbers():
    p = SamplingParams.from_dict({"top_k": 50.0, "temperature": np.float32(0.5), "repetition_penalty_window": 3})
    assert p.top_k == 50 and type(p.top_k) is int and p.temperature == 0.5 and type(p.temperature) is float
    with pytest.raises(ZonosInputError, match="sampling_params must be a dict"):
        SamplingParams.from_dict([("top_k", 5)])


def test_extreme_but_finite_params_never_give_nan_draws():
    """A tiny temperature or a penalty factor that underflows makes some logits +inf; the draw follows them."""
    logits = torch.tensor([[[3.0, 2.9, float("-inf")]]])
    assert sample_tokens(logits, SamplingParams(temperature=1e-40), generator=torch.Generator()).item() == 0
    params = SamplingParams(repetition_penalty=1e-30, repetition_penalty_window=3)
    assert sample_tokens(logits, params, torch.tensor([[[1, 1, 1]]]), torch.Generator()).item() == 1


@pytest.mark.parametrize(
    "weights",
    [{"linear": 0.5, "conf": -0.5}, {"linear": 0.5, "quad": -2.0}, {"linear": 2.0, "conf": -2.0, "quad": -2.0}],
)
def test_inverted_unified_weights_never_draw_a_masked_token(weights):
    """Negative unified weights (the demo's sliders reach -2) favour unlikely tokens, but a token of probability 0
    (the masked pad and EOS columns) stays at 0: upstream's log(1e-20) score made those win and the codes all zero."""
    from zonos.ops.sampler import RowParams, features, sample_rows

    logits = torch.randn(64, 9, 1026, generator=torch.Generator().manual_seed(0))
    logits[..., 1025] = float("-inf")
    logits[:, 1:, 1024] = float("-inf")
    params = SamplingParams(repetition_penalty=1.0, **weights)
    tokens = sample_tokens(logits, params, generator=torch.Generator().manual_seed(1))[..., 0]
    assert (tokens[:, 1:] < 1024).all() and (tokens < 1025).all()  # codebook 0 may end (EOS is 1024)
    rows = RowParams.allocate(64, torch.device("cpu"))
    for i in range(64):
        rows.set_row(i, params)
    keys = torch.arange(64), torch.zeros(64, dtype=torch.long)
    per_row = sample_rows(logits, rows, torch.zeros(64, 9, 1, dtype=torch.long), torch.zeros(64, 1, dtype=torch.bool),
                          *keys, features([params]))  # fmt: skip
    assert (per_row[:, 1:] < 1024).all() and (per_row < 1025).all()
    # The inverted draw favours the unlikely tokens: the mean logit drawn is below the mean logit.
    finite = logits[:, 1:, :1024]
    assert logits[:, 1:].gather(-1, tokens[:, 1:, None]).mean() < finite.mean()


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ({"temperature": 1e39}, "temperature must lie in"),
        ({"temperature": 2e6}, "temperature must lie in"),
        ({"linear": 3e38}, "linear must lie in"),
        ({"conf": -3.5e38}, "conf must lie in"),
        ({"quad": 1e7}, "quad must lie in"),
        ({"repetition_penalty": 1e300}, "repetition_penalty must lie in"),
        ({"top_k": 2**63}, "top_k must"),
        ({"repetition_penalty_window": 2**40}, "repetition_penalty_window must"),
    ],
)
def test_values_that_overflow_float32_sampling_are_refused(bad, pattern):
    with pytest.raises(ZonosInputError, match=pattern):
        SamplingParams.from_dict(bad)


def test_a_penalty_factor_that_overflows_leaves_zero_logits_finite():
    """penalty**count overflowing to inf must not turn a logit of exactly 0 into NaN (0 * inf)."""
    params = SamplingParams(temperature=0, repetition_penalty=1e6, repetition_penalty_window=64)
    logits = torch.tensor([[[0.0, -1.0, -5.0]]])
    recent = torch.zeros(1, 1, 64, dtype=torch.long)  # token 0, 64 times: factor 1e384 = inf
    penalized = apply_repetition_penalty(logits, recent, 1e6)
    assert penalized[0, 0, 0] == 0 and not penalized.isnan().any()
    assert sample_tokens(logits, params, recent).item() == 0
