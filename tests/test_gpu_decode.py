"""The CUDA-graph decode runner equals the eager decode step (tiny hybrid model, fp32, on a GPU).

Every run records the logits of each decode step through a wrapper around the model's ``_step``; the
wrapper is part of the captured step, so in graph mode it keeps pointing at the graph's logits buffer,
which each replay rewrites (prefill does not go through ``_step``). A wrapper around ``_guided_logits``
bars EOS from codebook 0 (so every run lasts its full length) unless a test asks for EOS at a position.
"""

import pytest
import torch

from tests.tiny import random_state_dict, tiny_config
from zonos.config import ZonosConfig
from zonos.model import SYNC_EVERY, Zonos
from zonos_accel.graph import CudaGraphDecodeStep, disable_cuda_graphs, enable_cuda_graphs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
STEPS = 60


def test_cuda_graphs_need_a_cuda_model():
    model = Zonos(ZonosConfig.from_dict(tiny_config("hybrid")))
    with pytest.raises(ValueError, match="CUDA device"):
        enable_cuda_graphs(model)


def _model(eos_at: int | None = None) -> Zonos:
    torch.manual_seed(0)
    model = Zonos(ZonosConfig.from_dict(tiny_config("hybrid")), max_seqlen=256)
    model.load_checkpoint(random_state_dict(model, 0), device="cuda", dtype=torch.float32)
    model = model.cuda().eval()
    guided, step = model._guided_logits, model._step

    def eos_controlled(last_hidden, cfg_scale):
        logits = guided(last_hidden, cfg_scale)
        if eos_at is None:
            logits[:, 0, model.eos_token_id] = float("-inf")
        else:  # EOS wins codebook 0 from position eos_at on (a device-side condition, so it is captured too)
            at = (model._state.position >= eos_at)[None]
            logits[:, 0, model.eos_token_id] = torch.where(at, 1e4, float("-inf"))
        return logits

    def recorded(codes, state, cfg_scale):
        model.last_logits = step(codes, state, cfg_scale)
        return model.last_logits

    model._guided_logits = eos_controlled
    model._step = recorded
    return model


def _prefix(length: int, seed: int) -> torch.Tensor:
    return torch.randn(2, length, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))


def _generate(model, prefix, params=None, seed=0, cfg_scale=2.0, stop_after=None, generator=True):
    """Codes and per-step logits of one request; ``stop_after`` cancels it after that many steps."""
    logits = []

    def callback(frame, step, max_steps):
        logits.append(model.last_logits.clone())
        return stop_after is None or step < stop_after

    if generator:
        gen = torch.Generator("cuda").manual_seed(seed)
    else:
        gen = None
        torch.cuda.manual_seed(seed)
    codes = model.generate(
        prefix,
        max_new_tokens=STEPS,
        cfg_scale=cfg_scale,
        sampling_params=params,
        progress_bar=False,
        callback=callback,
        generator=gen,
    )
    offset = gen.get_offset() if gen is not None else torch.cuda.default_generators[0].get_offset()
    return codes, torch.stack(logits), offset


def _assert_same(eager, graph):
    codes_e, logits_e, offset_e = eager
    codes_g, logits_g, offset_g = graph
    assert logits_g.shape == logits_e.shape and logits_e.shape[0] >= 50
    finite = torch.isfinite(logits_e)
    assert torch.equal(finite, torch.isfinite(logits_g))
    torch.testing.assert_close(logits_g[finite], logits_e[finite], rtol=1e-5, atol=1e-5)
    assert torch.equal(codes_g, codes_e)
    assert offset_g == offset_e  # the caller's generator advanced exactly as in eager mode


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    "params", [{"min_p": 0.1}, {"temperature": 0.0}, {"top_k": 20, "top_p": 0.9, "temperature": 0.8}]
)
def test_graph_replay_equals_eager_across_requests(params):
    model = _model()
    a, b = _prefix(11, 1), _prefix(17, 2)
    eager = [_generate(model, a, params, seed=5), _generate(model, b, params, seed=6)]

    runner = enable_cuda_graphs(model)
    assert isinstance(model._decode_step, CudaGraphDecodeStep)
    graph_a = _generate(model, a, params, seed=5)
    assert runner.captures == 1
    _generate(model, _prefix(5, 3), params, seed=7, stop_after=7)  # a cancelled request in between
    graph_b = _generate(model, b, params, seed=6)
    assert runner.captures == 1  # later requests replay the same graph

    _assert_same(eager[0], graph_a)
    _assert_same(eager[1], graph_b)
    if params.get("temperature") == 0.0:
        assert not torch.equal(graph_a[0], graph_b[0])  # different prefixes, different greedy codes


@cuda
@pytest.mark.gpu
def test_default_generator_and_guidance_off():
    model = _model()
    prefix = _prefix(13, 4)
    eager = [_generate(model, prefix, seed=8, generator=False), _generate(model, prefix, seed=9, cfg_scale=1.0)]
    runner = enable_cuda_graphs(model)
    graph = [_generate(model, prefix, seed=8, generator=False), _generate(model, prefix, seed=9, cfg_scale=1.0)]
    assert runner.captures == 2  # one per guidance setting (the state is reallocated for batch 1)
    for e, g in zip(eager, graph):
        _assert_same(e, g)


@cuda
@pytest.mark.gpu
def test_eos_bookkeeping_in_the_graph():
    model = _model(eos_at=40)
    prefix = _prefix(9, 5)
    eager = model.generate(prefix, max_new_tokens=STEPS, progress_bar=False, generator=torch.Generator("cuda"))
    enable_cuda_graphs(model)
    graph = model.generate(prefix, max_new_tokens=STEPS, progress_bar=False, generator=torch.Generator("cuda"))
    assert eager.shape[2] < STEPS - 9  # stopped early, after EOS ran down the codebooks
    assert torch.equal(graph, eager)
    disable_cuda_graphs(model)
    assert "_decode_step" not in model.__dict__


@cuda
@pytest.mark.gpu
def test_end_is_seen_within_two_check_intervals():
    """On CUDA the loop reads its end-of-generation flag one check interval late (no queue drain), so it
    stops fewer than 2 * SYNC_EVERY steps after codebook 8's EOS, and never before it."""
    model = _model(eos_at=40)
    enable_cuda_graphs(model)
    columns, write = {}, model._write

    def recording_write(delayed, offset, tokens):
        write(delayed, offset, tokens)
        columns[offset] = delayed[0, :, offset].cpu()

    model._write = recording_write
    model.generate(_prefix(9, 5), max_new_tokens=STEPS, progress_bar=False)
    eos_column = min(c for c, col in columns.items() if col[0] == model.eos_token_id)
    assert eos_column + 8 <= max(columns) < eos_column + 8 + 2 * SYNC_EVERY
    disable_cuda_graphs(model)


@cuda
@pytest.mark.gpu
def test_prepare_captures_before_the_first_request():
    model = _model()
    prefix = _prefix(8, 6)
    eager = _generate(model, prefix, seed=3)
    runner = enable_cuda_graphs(model)
    runner.prepare(batch_size=1, cfg_scale=2.0, sampling_params={"min_p": 0.1})
    assert runner.captures == 1
    graph = _generate(model, prefix, {"min_p": 0.1}, seed=3)
    assert runner.captures == 1
    _assert_same(eager, graph)


@cuda
@pytest.mark.gpu
def test_graph_with_triton_ops_equals_eager_reference():
    from zonos_accel.triton import OPS, disable_triton_ops, enable_triton_ops

    model = _model()
    prefix = _prefix(12, 7)
    eager = _generate(model, prefix, {"temperature": 0.0})
    # ssd_scan (prefill) is left out: mamba_ssm's chunked kernels need larger chunks than the tiny model's 8.
    enable_triton_ops(tuple(op for op in OPS if op != "ssd_scan"))
    try:
        enable_cuda_graphs(model)
        fast = _generate(model, prefix, {"temperature": 0.0})
    finally:
        disable_triton_ops()
    codes_e, logits_e, _ = eager
    codes_f, logits_f, _ = fast
    finite = torch.isfinite(logits_e)
    torch.testing.assert_close(logits_f[finite], logits_e[finite], rtol=1e-4, atol=1e-4)
    assert torch.equal(codes_f, codes_e)


@cuda
@pytest.mark.gpu
def test_programmatic_dependent_launch_changes_no_result():
    """Our Triton kernels launched with PDL (the default) inside the graph give bit for bit the results of
    the same kernels launched in stream order: PDL only moves launches, never a read before a write."""
    from zonos_accel.triton import OPS, disable_triton_ops, enable_triton_ops, pdl

    results = []
    for enabled in (False, True):
        pdl.ENABLED = enabled
        model = _model()
        enable_triton_ops(tuple(op for op in OPS if op != "ssd_scan"))
        try:
            enable_cuda_graphs(model)
            results.append(_generate(model, _prefix(12, 7), {"min_p": 0.1}))
        finally:
            disable_triton_ops()
            pdl.ENABLED = True
    (codes_a, logits_a, _), (codes_b, logits_b, _) = results
    assert torch.equal(codes_a, codes_b)
    assert torch.equal(logits_a, logits_b)
