"""The engine's per-row sampling op, ``zonos.ops.sample_rows`` (zonos/ops/sampler.py), and its fused Triton kernel
(zonos_accel/triton/sampler.py) against it.

The kernel runs compiled on the GPU (where there is one) or, with TRITON_INTERPRET=1, in Triton's interpreter on
the CPU. Inputs are fresh random logits at the model's shape (9 codebooks × 1026 columns, the pad column and EOS
outside codebook 0 at -inf), rows with unrelated parameters (greedy, repetition penalty with repeated tokens in the
window, the unified sampler, min-p) and their own seeds and steps.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.kernel_checks import TARGETS, kernel_device
from zonos.ops import sample_rows
from zonos.ops.sampler import RowParams, exponential_noise, features, noise_keys
from zonos.sampling import SamplingParams

VOCAB, EOS, Q, W = 1026, 1024, 9, 64


@pytest.fixture(scope="module", params=TARGETS)
def device(request) -> torch.device:
    return kernel_device(request.param)


ROWS = [
    SamplingParams(),
    SamplingParams(temperature=0.0),
    SamplingParams(repetition_penalty=3.0, repetition_penalty_window=4),
    SamplingParams(linear=0.5, conf=0.4, quad=0.2),
    SamplingParams(min_p=0.1, temperature=0.7),
    SamplingParams(min_p=0.05, repetition_penalty=1.5, repetition_penalty_window=64, linear=0.6, conf=0.2, quad=0.1),
    SamplingParams(temperature=0.0, repetition_penalty=2.0, repetition_penalty_window=8),
    SamplingParams(linear=0.5, conf=-2.0, quad=-1.0),  # inverted weights: the masked columns must stay out
]


def _inputs(rows, device, seed):
    g = torch.Generator().manual_seed(seed)
    n = len(rows)
    logits = torch.randn(n, Q, VOCAB, generator=g) * 3
    logits[..., VOCAB - 1] = float("-inf")  # the pad column
    logits[:, 1:, EOS] = float("-inf")  # only codebook 0 may end
    p = RowParams.allocate(n, torch.device("cpu"))
    for i, r in enumerate(rows):
        p.set_row(i, r)
    recent = torch.randint(0, 40, (n, Q, W), generator=g)  # few distinct ids: repeats in every window
    recent[0, :, :5] = -1  # an idle slot's UNKNOWN
    columns = torch.arange(W)
    valid = columns >= W - p.window[:, None]
    seeds = torch.randint(0, 2**62, (n,), generator=g)
    steps = torch.randint(0, 5000, (n,), generator=g)
    p = RowParams(**{k: v.to(device) for k, v in vars(p).items()})
    return [t.to(device) for t in (logits, recent, valid, seeds, steps)], p


def test_noise_is_a_function_of_seed_step_and_element():
    """A row's noise depends on its seed, step and element index alone: another batch around it, or another order of
    the rows, draws the same values; another step draws others."""
    seeds = torch.tensor([5, 2**61 + 7, 5])
    steps = torch.tensor([3, 3, 4])
    keys = noise_keys(seeds, steps)
    draws = exponential_noise(keys, (Q, VOCAB), torch.float32)
    alone = exponential_noise(noise_keys(seeds[1:2], steps[1:2]), (Q, VOCAB), torch.float32)
    assert torch.equal(draws[1], alone[0])
    assert not torch.equal(draws[0], draws[2])  # the same seed one step later
    assert (draws > 0).all() and abs(draws.mean().item() - 1.0) < 0.02  # Exp(1)


def test_rows_do_not_depend_on_their_neighbours():
    """Each row's token is the one it gets alone, whatever filters the other rows of the batch use."""
    (logits, recent, valid, seeds, steps), p = _inputs(ROWS, torch.device("cpu"), seed=1)
    use = features(ROWS)
    together = sample_rows(logits, p, recent, valid, seeds, steps, use)
    for i, row in enumerate(ROWS):
        one = RowParams(**{k: v[i : i + 1] for k, v in vars(p).items()})
        inputs = [t[i : i + 1] for t in (logits, recent, valid, seeds, steps)]
        alone = sample_rows(inputs[0], one, *inputs[1:], features([row]))
        assert torch.equal(together[i], alone[0]), i


@pytest.mark.parametrize("use", list(itertools.product([False, True], repeat=4)), ids=str)
def test_fused_kernel_gives_the_reference_tokens(device, use):
    """For every combination of the fused filters (penalty, greedy, unified, min-p), over fresh logits and seeds, the
    kernel's tokens are the reference's (float rounding of the softmax sums could reorder two candidates within
    ~1e-7 of each other; none does here), each within the vocabulary."""
    from zonos_accel.triton.sampler import sample_rows as fused

    penalty, greedy, unified, min_p = use
    flags = (penalty, greedy, unified, False, False, min_p)
    for seed in range(3):
        (logits, recent, valid, seeds, steps), p = _inputs(ROWS, device, seed=10 + seed)
        expected = sample_rows(logits, p, recent, valid, seeds, steps, flags)
        got = fused(logits, p, recent, valid, seeds, steps, flags)
        assert got.dtype == torch.int64 and got.shape == (len(ROWS), Q)
        assert ((got >= 0) & (got < VOCAB)).all()
        assert torch.equal(got, expected), (seed, (got != expected).nonzero().tolist())


def test_fused_kernel_leaves_sorting_filters_to_the_reference(device):
    """A batch in which a row uses top-p or top-k runs the reference: the same tokens."""
    from zonos_accel.triton.sampler import sample_rows as fused

    rows = [*ROWS[:3], SamplingParams(top_p=0.8), SamplingParams(top_k=20, min_p=0.1)]
    (logits, recent, valid, seeds, steps), p = _inputs(rows, device, seed=3)
    use = features(rows)
    assert use[3] and use[4]
    assert torch.equal(
        fused(logits, p, recent, valid, seeds, steps, use), sample_rows(logits, p, recent, valid, seeds, steps, use)
    )


def test_engine_with_the_fused_sampler_decodes_the_reference_codes(device, tmp_path):
    """Through the engine (the slots' gathered windows, seeds and steps as the decode step passes them, and their
    buffers for the step's bookkeeping), requests with unrelated sampling settings running side by side give the
    codes they give on the reference ops, EOS included."""
    if device.type != "cpu":
        pytest.skip("the GPU decode tests cover the fused sampler on CUDA")
    from tests.test_model import _prefix
    from tests.tiny import tiny_model
    from zonos.ops.backend import REFERENCE
    from zonos_accel.triton.sampler import finish_rows as fused_finish
    from zonos_accel.triton.sampler import sample_rows as fused

    model = tiny_model(tmp_path, max_seqlen=96)
    model.start_engine(slots=3)
    prefix = _prefix(model, "Fused sampling.")
    settings = [{"min_p": 0.1}, {"temperature": 0.0}, {"linear": 0.5, "conf": 0.3, "quad": 0.1, "min_p": 0.05}]

    def run():
        handles = [
            model.submit(prefix, max_new_tokens=12, sampling_params=s, generator=torch.Generator().manual_seed(i))
            for i, s in enumerate(settings)
        ]
        return [h.result() for h in handles]

    expected = run()
    model.set_backend(REFERENCE.replace("fused sampler", sample_rows=fused, finish_rows=fused_finish))
    try:
        got = run()
    finally:
        model.set_backend(REFERENCE)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and torch.equal(g, e)


def test_fused_step_bookkeeping_equals_the_reference(device):
    """``finish_rows`` in one launch leaves every slot buffer as the reference does: slots before, at and after
    their EOS (remaining 0, 1, 5, 9 and many steps; EOS sampled now or earlier), inactive slots, a column already
    written (an audio prefix's) and the last column of the buffer."""
    from zonos.ops import finish_rows
    from zonos_accel.triton.sampler import finish_rows as fused

    columns, unknown, masked = 40, -1, 1025
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        n = 7
        tokens = torch.randint(0, 1024, (n, Q), generator=g)
        tokens[[1, 4], 0] = EOS  # EOS sampled now
        remaining = torch.tensor([0, 100, 5, 9, 1, 3, 50])
        stopping = torch.tensor([False, False, True, True, False, True, False])
        offset = torch.randint(5, columns - 2, (n,), generator=g)
        offset[6] = columns - 1  # the buffer's last column: the write stays in it
        limit = offset + torch.randint(0, 4, (n,), generator=g)
        active = (remaining > 0) & (offset < limit)
        active[2] = False
        steps = torch.randint(0, 100, (n,), generator=g)
        delayed = torch.full((n, Q, columns), unknown)
        delayed[:, :, :5] = torch.randint(0, 1024, (n, Q, 5), generator=g)
        delayed[3, :, offset[3] + 1] = 77  # written before (an audio prefix)
        buffers = [delayed, offset, limit, remaining, stopping, steps, torch.zeros(n, dtype=torch.bool)]
        ref = [b.clone() for b in buffers]
        finish_rows(tokens, active, *ref[:-1], ref[-1], EOS, masked)
        got = [b.clone().to(device) for b in buffers]
        fused(tokens.to(device), active.to(device), *got[:-1], got[-1], EOS, masked)
        for name, r, f in zip(["delayed", "offset", "limit", "remaining", "stopping", "steps", "active"], ref, got):
            assert torch.equal(f.cpu(), r), (seed, name)
        assert not torch.equal(ref[0], delayed) and not torch.equal(ref[-1], buffers[-1])  # something was written
