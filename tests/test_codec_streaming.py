"""Streaming DAC decoding: exact against the one-shot decode, minimal latency, no recomputation.

CPU only, with a tiny random DAC that has the real model's strides and kernels (hence the same
receptive field) but few channels.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.replay_on_cpu import emulate_cuda_graphs
from tests.tiny import TINY_DAC, random_dac_weights
from zonos.codec import DAC, DACAutoencoder, DACConfig, StreamingDACDecoder, receptive_field
from zonos.ops.backend import REFERENCE, use_backend

TINY = TINY_DAC
HOP = 512
LOOKAHEAD = 4757  # derived in zonos/codec/streaming.py's docstring


@pytest.fixture(scope="module")
def codec() -> DACAutoencoder:
    config = DACConfig(**TINY)
    return DACAutoencoder(config, random_dac_weights(config))


def random_codes(batch: int, frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 1024, (batch, 9, frames), generator=torch.Generator().manual_seed(seed))


def snr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    err = (x.double() - ref.double()).pow(2).sum()
    return float("inf") if err == 0 else float(10 * torch.log10(ref.double().pow(2).sum() / err))


def stream(dec: StreamingDACDecoder, codes: torch.Tensor, schedule: list[int]) -> torch.Tensor:
    """Push ``codes`` in chunks of the given sizes (checking the emitted counts), then flush."""
    assert sum(schedule) == codes.shape[-1]
    dec.reset()
    outs, n = [], 0
    for size in schedule:
        out = dec.push(codes[..., n : n + size])
        n += size
        assert out.shape[:2] == (codes.shape[0], 1) and out.dtype == torch.float32
        outs.append(out)
        assert dec.samples_emitted == dec.receptive_field.samples_ready(n) == max(0, HOP * n - LOOKAHEAD)
    outs.append(dec.flush())
    return torch.cat(outs, dim=-1)


# -- receptive field ---------------------------------------------------------------------------


def test_receptive_field_numbers():
    rf = receptive_field()  # the 44.1 kHz model
    assert (rf.hop_length, rf.lookahead_samples, rf.left_context_samples) == (HOP, LOOKAHEAD, LOOKAHEAD)
    assert (rf.lookahead_frames, rf.left_context_frames) == (10, 10)
    assert rf.lookahead_ms == pytest.approx(107.87, abs=0.01)
    assert rf.samples_ready(9) == 0 and rf.samples_ready(10) == 363 and rf.samples_ready(11) == 875
    # The tiny test model has the same strides and kernels, hence the same receptive field.
    assert receptive_field(DACConfig(**TINY)) == rf


def test_receptive_field_is_exact_in_one_shot_decode():
    """Sample t of the one-shot decode depends on exactly frames floor((t - L) / 512) .. floor((t + L) / 512).

    Dependence is read off the gradient of sample t: far-reaching paths pass the outermost taps
    of every layer and are far too small to show up as a difference of two float decodes, but
    their gradient is nonzero.
    """
    config = DACConfig(**TINY)
    dac = DAC(config).double().eval()
    dac.load_state_dict({k: v.double() for k, v in random_dac_weights(config).items()})
    frames, f = 22, 10
    first, last = HOP * f - LOOKAHEAD, HOP * f + HOP - 1 + LOOKAHEAD  # the samples frame f reaches
    samples = [0, first - 1, first, 5000, last, last + 1, frames * HOP - 1]
    # One batch row per probed sample, so that a single backward pass gives all the gradients.
    latent = torch.randn(1, 64, frames, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    latent = latent.repeat(len(samples), 1, 1).requires_grad_(True)
    out = dac.decode_latent(latent)[:, 0]
    out[torch.arange(len(samples)), torch.tensor(samples)].sum().backward()
    for row, t in enumerate(samples):
        used = latent.grad[row].abs().sum(0).nonzero().flatten().tolist()
        lo, hi = max(0, (t - LOOKAHEAD) // HOP), min(frames - 1, (t + LOOKAHEAD) // HOP)
        assert used == list(range(lo, hi + 1)), t


# -- exactness ---------------------------------------------------------------------------------

SCHEDULES = {
    "ones": [1] * 23,
    "odd_growing": [1, 3, 5, 7, 9],
    "sevens": [7, 7, 7, 7, 3],
    "one_then_16s": [1, 16, 16, 4],
    "odd_total": [2, 5, 11, 1],
    "single_frame": [1],
    "all_at_once": [19],
    "short_then_empty": [3, 0, 2],
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_stream_equals_one_shot_decode(codec, name):
    schedule = SCHEDULES[name]
    codes = random_codes(2, sum(schedule), seed=len(name))
    full = codec.decode(codes)
    out = stream(StreamingDACDecoder(codec), codes, schedule)
    assert out.shape == full.shape
    assert snr_db(out, full) >= 90.0
    assert (out - full).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["sevens", "one_then_16s", "odd_total", "single_frame"])
def test_16_bit_stream_is_bit_exact_with_length_independent_convs(codec, monkeypatch, dtype, name):
    """Under 16-bit autocast every conv output is rounded, so a stream equals the one-shot decode only if each
    output sample is one conv sum over the same inputs (bias included), as in one-shot. The convs here sum in
    float64 (so a sample's value cannot depend on the length of the conv's input, whatever the backend does)
    and round like autocast: then the stream must be bit for bit equal. Adding the partial sums of two calls,
    or a bias after the conv, would round twice and fail."""
    conv1d, conv_t = F.conv1d, F.conv_transpose1d

    def exact(fn):
        def conv(x, w, b=None, *args, **kwargs):
            out_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
            x, w, b = (None if t is None else t.to(out_dtype).double() for t in (x, w, b))
            with torch.autocast("cpu", enabled=False):
                return fn(x, w, b, *args, **kwargs).to(out_dtype)

        return conv

    monkeypatch.setattr(F, "conv1d", exact(conv1d))
    monkeypatch.setattr(F, "conv_transpose1d", exact(conv_t))
    schedule = SCHEDULES[name]
    codes = random_codes(1, sum(schedule), seed=len(name))
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        full = codec.dac.decode(codes)
        out = stream(StreamingDACDecoder(codec, fp16_autocast=False), codes, schedule)
    assert full.dtype == dtype and out.shape == full.shape
    assert torch.equal(out, full.float())


@pytest.mark.parametrize("last", [0, 3], ids=["finish-alone", "finish-with-input"])
@pytest.mark.parametrize("k,s,p", [(16, 8, 4), (4, 2, 1), (6, 2, 2), (7, 3, 0), (4, 4, 0), (5, 2, 3)])
def test_transposed_conv_stage_equals_the_module(k, s, p, last):
    """The transposed-conv stage on its own, kernels of one to three strides, float64: pushes of 1, 2, 3 and
    0 inputs, then the end of the stream with or without the last 3 inputs, give the module's output."""
    from zonos.codec.streaming import WeightCasts, _ConvTranspose, _Params

    conv = torch.nn.ConvTranspose1d(3, 2, k, stride=s, padding=p).double()
    x = torch.randn(2, 3, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(k * s + p))
    stage = _ConvTranspose(conv, _Params(WeightCasts()))
    outs, n = [], 0
    for size in (1, 2, 0, 3, 3)[: 5 - bool(last)]:
        outs.append(stage.push(x[..., n : n + size]))
        n += size
    outs.append(stage.finish(x[..., n:] if last else None))
    out = torch.cat([y for y in outs if y is not None], dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(out, conv(x), rtol=1e-12, atol=1e-12)


def test_push_latent_and_float64(codec):
    """Works on the DAC's own dtype; in float64 it is exact to ~1e-12."""
    config = DACConfig(**TINY)
    dac64 = DAC(config).double().eval()
    dac64.load_state_dict({k: v.double() for k, v in random_dac_weights(config).items()})
    latent = torch.randn(1, 64, 14, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = dac64.decode_latent(latent)
    dec = StreamingDACDecoder(dac64)
    parts = [dec.push_latent(latent[..., i : i + 3]) for i in range(0, 14, 3)] + [dec.flush()]
    out = torch.cat(parts, dim=-1)
    assert out.dtype == torch.float32  # outputs are float32 whatever the codec's dtype
    assert torch.allclose(out.double(), full, atol=1e-6)
    assert snr_db(out.double(), full) > 130


# -- latency: nothing emitted early, nothing held back -----------------------------------------


def test_emitted_samples_do_not_depend_on_future_frames(codec):
    codes = random_codes(1, 24, seed=7)
    other = codes.clone()
    other[..., 14:] = random_codes(1, 10, seed=8)  # different future after frame 13
    dec = StreamingDACDecoder(codec)
    emitted = torch.cat([dec.push(codes[..., :6]), dec.push(codes[..., 6:14])], dim=-1)
    assert emitted.shape[-1] == HOP * 14 - LOOKAHEAD
    # Both futures' one-shot decodes agree with what was already emitted.  (That the next sample
    # does depend on frame 14, so could not have been emitted, is test_receptive_field_is_exact...)
    for future in (codes, other):
        full = codec.decode(future)[..., : emitted.shape[-1]]
        assert (emitted - full).abs().max() < 1e-5
    # Pushing the differing future changes nothing already out: the rest is still exact.
    rest = torch.cat([dec.push(other[..., 14:]), dec.flush()], dim=-1)
    assert snr_db(torch.cat([emitted, rest], dim=-1), codec.decode(other)) >= 90.0


def test_flush_emits_the_rest(codec):
    dec = StreamingDACDecoder(codec)
    for n in range(1, 13):
        dec.push(random_codes(1, 1, seed=n))
    tail = dec.flush()
    assert tail.shape[-1] == LOOKAHEAD and dec.samples_emitted == 12 * HOP


# -- cost: no re-decoding ----------------------------------------------------------------------


def test_streaming_does_no_more_conv_work_than_one_shot(codec, monkeypatch):
    """Count multiply-accumulates of every conv call: 1-frame streaming redoes no work, except the one input of
    history each transposed-conv call recomputes (so that each output is one conv sum, as in one-shot)."""
    macs = {"n": 0, "history": 0}
    conv1d, conv_t = F.conv1d, F.conv_transpose1d

    def counting_conv1d(x, w, *args, **kwargs):
        y = conv1d(x, w, *args, **kwargs)
        macs["n"] += y.numel() * w.shape[1] * w.shape[2]
        return y

    def counting_conv_t(x, w, *args, **kwargs):
        macs["n"] += x.numel() * w.shape[1] * w.shape[2]
        macs["history"] += x.shape[0] * w.numel()  # one input sample of every channel
        return conv_t(x, w, *args, **kwargs)

    monkeypatch.setattr(F, "conv1d", counting_conv1d)
    monkeypatch.setattr(F, "conv_transpose1d", counting_conv_t)
    codes = random_codes(1, 20, seed=9)
    codec.decode(codes)
    one_shot, macs["n"], macs["history"] = macs["n"], 0, 0
    stream(StreamingDACDecoder(codec), codes, [1] * 20)
    # The codebook projections (kernel-1 convs of the quantizer) run per push in both, so equal too.
    assert macs["n"] == one_shot + macs["history"]
    assert macs["history"] < 0.05 * one_shot


# -- lifecycle ---------------------------------------------------------------------------------


def test_reset_makes_the_decoder_reusable(codec):
    dec = StreamingDACDecoder(codec)
    dec.push(random_codes(3, 5, seed=10))  # a cancelled stream with another batch size
    dec.reset()
    codes = random_codes(1, 12, seed=11)
    out = torch.cat([dec.push(codes[..., :4]), dec.push(codes[..., 4:]), dec.flush()], dim=-1)
    assert snr_db(out, codec.decode(codes)) >= 90.0


def test_misuse_errors(codec):
    dec = StreamingDACDecoder(codec)
    dec.push(random_codes(1, 2, seed=12))
    with pytest.raises(ValueError, match="batch size changed"):
        dec.push(random_codes(2, 1, seed=13))
    with pytest.raises(ValueError, match="EOS"):
        dec.push(torch.full((1, 9, 1), 1025))
    dec.flush()
    with pytest.raises(RuntimeError, match="reset"):
        dec.push(random_codes(1, 1, seed=14))
    with pytest.raises(RuntimeError, match="reset"):
        dec.flush()
    dec.reset()
    assert dec.flush().shape[-1] == 0  # nothing pushed: nothing to flush


# -- fixed-address state (what the CUDA graphs of the GPU path rely on; tests/test_gpu_vocoder.py
#    checks the graphs themselves) --------------------------------------------------------------


def _static_on_cpu(monkeypatch):
    """Keep the state at fixed addresses on the CPU too (the decoder does that only on CUDA)."""
    start = StreamingDACDecoder._start

    def static_start(self, batch, device):
        start(self, batch, device)
        for stage in self._all_stages():
            stage.static = True

    monkeypatch.setattr(StreamingDACDecoder, "_start", static_start)


class _Reads(torch.utils._python_dispatch.TorchDispatchMode):
    """Storages that ops read without having made them inside the mode."""

    def __init__(self):
        super().__init__()
        self.made: set[int] = set()
        self.read: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in torch.utils._pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.made:
                self.read.add(t.untyped_storage().data_ptr())
        out = func(*args, **kwargs)
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.made.add(t.untyped_storage().data_ptr())
        return out


def test_static_state_lives_in_fixed_buffers(codec, monkeypatch):
    """With static state, a push reads nothing but its input, the weights and the stages' buffers,
    and leaves every state tensor in a buffer: what a CUDA graph captured from it can replay.  The
    results are those of the plain decoder, bit for bit."""
    _static_on_cpu(monkeypatch)
    schedule = [3, 5, 4, 4, 4, 1, 4]
    codes = random_codes(2, sum(schedule), seed=21)
    ref = stream(StreamingDACDecoder(codec), codes, [sum(schedule)])
    dec = StreamingDACDecoder(codec)
    stages = [s for s in dec._all_stages() if s.state_attrs]
    weights = {p.untyped_storage().data_ptr() for p in codec.dac.parameters()}
    outs, n = [], 0
    for size in schedule:
        chunk = codes[..., n : n + size].clone()
        n += size
        buffers = {b.untyped_storage().data_ptr() for s in stages for b in s._buffers.values()}
        with _Reads() as reads:
            outs.append(dec.push(chunk))
        stacked = {t.untyped_storage().data_ptr() for kept in codec.dac._stacked.values() for t in kept[1:]}
        allowed = weights | stacked | buffers | {chunk.untyped_storage().data_ptr(), 0}
        assert reads.read <= allowed, "a push read a tensor from outside its input, weights (kept stacked) and state"
        for stage in stages:
            for attr in stage.state_attrs:
                value = getattr(stage, attr)
                assert not isinstance(value, torch.Tensor) or any(value is b for b in stage._buffers.values())
    outs.append(dec.flush())
    assert (torch.cat(outs, -1) - ref).abs().max() < 1e-5
    # Same samples as the decoder without static state.
    assert torch.equal(torch.cat(outs, -1), stream(StreamingDACDecoder(codec, cuda_graphs=False), codes, schedule))


def test_autocast_weights_cast_once_are_bit_exact(codec):
    """Under (CPU) fp16 autocast the stages get fp16 copies of the conv weights made once per stream;
    autocast would cast them the same way in every call."""
    codes = random_codes(1, 20, seed=22)
    schedule = [11, 4, 4, 1]
    cached = StreamingDACDecoder(codec, fp16_autocast=True)
    per_call = StreamingDACDecoder(codec, fp16_autocast=True)
    per_call._params.enabled = False
    out = stream(cached, codes, schedule)
    assert cached._params.dtype == torch.float16 and per_call._params.dtype is None
    assert torch.equal(out, stream(per_call, codes, schedule))
    # Weights changed in place between streams are picked up (the copies are refreshed in place).
    conv = codec.dac.decoder.conv2.weight
    saved = conv.clone()
    try:
        with torch.no_grad():
            conv.mul_(2)
        assert torch.equal(stream(cached, codes, schedule), stream(per_call, codes, schedule))
    finally:
        with torch.no_grad():
            conv.copy_(saved)


def test_decoders_sharing_weight_casts_hold_one_copy(codec):
    """Decoders given one :class:`WeightCasts` (an engine's) take the same fp16 copies of the conv weights, made once,
    and each decodes exactly what a decoder with its own copies decodes, interleaved with the others."""
    from zonos.codec.streaming import WeightCasts

    casts = WeightCasts()
    shared = [StreamingDACDecoder(codec, fp16_autocast=True, casts=casts) for _ in range(2)]
    own = StreamingDACDecoder(codec, fp16_autocast=True)
    codes = [random_codes(1, 20, seed=30 + i) for i in range(2)]
    schedule = [11, 4, 4, 1]
    outs: list[list[torch.Tensor]] = [[], []]
    for d in shared:
        d.reset()
    start = 0
    for size in schedule:  # the two streams interleaved
        for i, d in enumerate(shared):
            outs[i].append(d.push(codes[i][..., start : start + size]))
        start += size
    for i, d in enumerate(shared):
        outs[i].append(d.flush())
        assert torch.equal(torch.cat(outs[i], -1), stream(own, codes[i], schedule)), i
    weight = codec.dac.decoder.conv2.weight
    copies = {d._params(weight).data_ptr() for d in shared}
    assert len(copies) == 1 and own._params(weight).data_ptr() not in copies
    assert shared[0]._params(weight).dtype == torch.float16 and weight.dtype == torch.float32
    assert len(casts._copies) == len(shared[0]._conv_params)  # one copy per weight and bias, not per decoder


@pytest.mark.parametrize("name", ["ones", "odd_growing", "one_then_16s"])
def test_pushes_from_states_of_equal_shapes_touch_equal_buffers(codec, monkeypatch, name):
    """What the CUDA graphs are keyed by: two pushes of one size from states of the same shapes
    (the same ``_graph_key``) read and write the same state buffers, and leave the state in the same ones, so a
    graph captured from one replays the other.  Repeated push sizes reach one such key once every layer
    holds its full context (a stream starting with 1-frame pushes takes ~11 of them)."""
    _static_on_cpu(monkeypatch)
    schedule = SCHEDULES[name] + [1] * 14
    codes = random_codes(1, sum(schedule), seed=20)
    dec = StreamingDACDecoder(codec)
    stages = [s for s in dec._all_stages() if s.state_attrs]
    seen: dict[tuple, tuple] = {}
    keys = []
    n = 0
    for size in schedule:
        chunk = codes[..., n : n + size].clone()
        key = dec._graph_key("codes", chunk)
        n += size
        with _Reads() as reads:
            dec.push(chunk)
        buffers = {b.untyped_storage().data_ptr() for s in stages for b in s._buffers.values()}
        after = tuple(
            getattr(s, a).untyped_storage().data_ptr() if isinstance(getattr(s, a), torch.Tensor) else getattr(s, a)
            for s in stages
            for a in s.state_attrs
        )
        touched = ((reads.read | reads.made) & buffers, after)
        assert seen.setdefault(key, touched) == touched, "two pushes with one graph key touched different buffers"
        keys.append(key)
    assert len(set(keys[-3:])) == 1, "repeated 1-frame pushes never reached a steady key"


@pytest.mark.parametrize("name", ["ones", "odd_growing", "one_then_16s", "sevens"])
def test_graph_replays_equal_eager_pushes(codec, monkeypatch, name):
    """The decoder's capture-and-replay logic, with CUDA graphs emulated on the CPU (tests/replay_on_cpu.py): a
    replay reruns the captured ops on the captured tensors, so a key that admits a push from a state it was not
    captured from gives wrong samples.  Stream 1 captures its repeated pushes, stream 2 the rest, stream 3
    replays every call; each equals the eager decoder bit for bit."""
    emulate_cuda_graphs(monkeypatch)
    schedule = SCHEDULES[name] + [1] * 6
    eager = StreamingDACDecoder(codec, cuda_graphs=False)
    graphed = StreamingDACDecoder(codec)
    for seed in range(3):
        codes = random_codes(1, sum(schedule), seed=30 + seed)
        replays = graphed.graph_replays
        assert torch.equal(stream(graphed, codes, schedule), stream(eager, codes, schedule)), seed
    assert graphed.graph_replays - replays == len(schedule) + 1  # the last stream: every push and the flush
    assert eager.graph_captures == eager.graph_replays == 0


def test_weights_changed_in_place_drop_the_graphs(monkeypatch):
    """Graphs are captured again after the weights change in place: a replay runs no Python, so data an op derives
    from the weights and caches (the Triton convs pack them) would be stale.  The next stream equals a fresh
    eager decoder's on the new weights."""
    emulate_cuda_graphs(monkeypatch)
    config = DACConfig(**TINY)
    codec = DACAutoencoder(config, random_dac_weights(config, seed=3))
    graphed = StreamingDACDecoder(codec)
    schedule = [11, 2, 2, 2]
    for seed in range(2):
        stream(graphed, random_codes(1, sum(schedule), seed=90 + seed), schedule)
    captures = graphed.graph_captures
    assert captures > 0
    with torch.no_grad():
        codec.dac.decoder.block[0].res_unit1.conv1.weight.mul_(1.5)
    codes = random_codes(1, sum(schedule), seed=95)
    eager = StreamingDACDecoder(codec, cuda_graphs=False)
    assert torch.equal(stream(graphed, codes, schedule), stream(eager, codes, schedule))
    assert graphed.graph_captures == 2 * captures


def test_inference_mode_weights_stream(monkeypatch):
    """A codec built under ``torch.inference_mode`` has inference-tensor weights, which keep no version count:
    the graph bookkeeping takes them (a GPU run once failed here) and the stream equals the eager one."""
    emulate_cuda_graphs(monkeypatch)
    config = DACConfig(**TINY)
    with torch.inference_mode():
        codec = DACAutoencoder(config, random_dac_weights(config, seed=4))
    assert next(codec.dac.parameters()).is_inference()
    schedule = [11, 3, 3]
    codes = random_codes(1, sum(schedule), seed=97)
    graphed, eager = StreamingDACDecoder(codec), StreamingDACDecoder(codec, cuda_graphs=False)
    for _ in range(3):
        assert torch.equal(stream(graphed, codes, schedule), stream(eager, codes, schedule))
    assert graphed.graph_replays > 0


def test_cached_state_key_follows_the_state(codec, monkeypatch):
    """The state's part of the graph key is cached between pushes (dropped by eager pushes and resets, taken
    from the capture after a replay): after every push of every stream it equals the key computed afresh."""
    emulate_cuda_graphs(monkeypatch)
    dec = StreamingDACDecoder(codec)
    schedule = [1, 3, 3, 3, 3, 3, 2]
    for seed in range(3):
        codes = random_codes(1, sum(schedule), seed=70 + seed)
        dec.reset()
        n = 0
        for size in schedule:
            dec.push(codes[..., n : n + size])
            n += size
            cached = dec._state_key()
            dec._state_key_cache = None
            assert dec._state_key() == cached
        dec.flush()
    assert dec.graph_replays >= 4


def test_reset_leaves_the_buffers_as_they_are(codec, monkeypatch):
    """reset() does not clear the state buffers (one launch each, hundreds per stream on CUDA): a push writes
    every buffer it reads earlier in the stream.  Buffers poisoned with NaN before each stream change nothing,
    through emulated graph replays too."""
    emulate_cuda_graphs(monkeypatch)
    graphed = StreamingDACDecoder(codec)
    eager = StreamingDACDecoder(codec, cuda_graphs=False)
    schedule = [1, 3, 3, 3, 3, 2]
    for seed in range(3):
        codes = random_codes(1, sum(schedule), seed=80 + seed)
        for stage in graphed._all_stages():
            for buf in stage._buffers.values():
                buf.fill_(float("nan"))
        assert torch.equal(stream(graphed, codes, schedule), stream(eager, codes, schedule)), seed
    assert graphed.graph_replays > 0 and sum(len(s._buffers) for s in graphed._all_stages()) > 0


def test_a_push_is_one_op_call_per_layer(codec):
    """A steady push makes the one-shot decoder's op calls (one launch each on the Triton path): a ``conv1d``
    for the 9 codebooks' projections together and per conv (bias, residual and tanh inside it), a
    ``conv_transpose1d`` per upsampling layer, a ``sequence_tail`` per conv input window (Snake's outputs
    included; a residual unit's also keeps its raw inputs); a residual unit's inner Snake is inside its first
    conv."""
    calls: dict[str, list] = {"conv1d": [], "conv_transpose1d": [], "sequence_tail": [], "snake": []}
    recording = {}
    for name, log in calls.items():
        original = REFERENCE.op(name)

        def record(*args, _original=original, _log=log, **kwargs):
            y = _original(*args, **kwargs)
            _log.append(y.dtype)
            return y

        recording[name] = record
    codes = random_codes(1, 19, seed=23)
    expected = codec.decode(codes)
    use_backend(codec.dac, REFERENCE.replace("recording", **recording))
    try:
        dec = StreamingDACDecoder(codec, fp16_autocast=True)
        outs = [dec.push(codes[..., :11]), dec.push(codes[..., 11:15])]
        for log in calls.values():
            log.clear()
        outs.append(dec.push(codes[..., 15:]))  # a steady push
    finally:
        use_backend(codec.dac, REFERENCE)
    convs = [m for m in codec.dac.decoder.modules() if isinstance(m, torch.nn.Conv1d)]
    assert len(calls["conv1d"]) == 1 + len(convs) == 27  # the codebooks' projection, then the decoder's
    assert len(calls["conv_transpose1d"]) == 4
    assert len(calls["snake"]) == 0  # in the windows and in the residual units' first convs
    # The first and last conv, each block's transposed conv, and each residual unit's conv1 (its raw inputs too).
    assert len(calls["sequence_tail"]) == 2 + 4 * (1 + 3)
    assert all(d == torch.float16 for log in calls.values() for d in log)
    outs.append(dec.flush())
    assert snr_db(torch.cat(outs, -1), expected.float()) > 30  # fp16 stream vs fp32 one-shot


@pytest.mark.parametrize("chunk", [1, 3, 4])
def test_steady_state_size_counts_what_a_stream_holds(codec, chunk):
    """The closed form that memory planning uses equals the values a stream's decoder state holds after steady
    pushes of ``chunk`` frames (the real-size figure, 14.7 M at 16 frames, comes from the same formula)."""
    from zonos.codec.slab import _states
    from zonos.codec.streaming import steady_state_size

    dec = StreamingDACDecoder(codec)
    codes = random_codes(1, 11 + 4 * chunk, seed=50)
    dec.push(codes[..., :11])
    for i in range(4):
        dec.push(codes[..., 11 + i * chunk : 11 + (i + 1) * chunk])
    held = sum(getattr(s, a).numel() for s, a in _states(dec) if isinstance(getattr(s, a), torch.Tensor))
    assert held == steady_state_size(codec.dac.config, chunk)
