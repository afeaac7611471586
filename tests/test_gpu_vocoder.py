"""CUDA graphs of the streaming DAC decoder (zonos/codec/streaming.py): replayed pushes return the eager
pushes' samples bit for bit (deterministic cuDNN, TF32 off) and the stream matches the one-shot decode
(≥ 90 dB in fp32; under fp16 autocast as close to the fp32 decode as the fp16 one-shot decode is),
across chunk schedules, streams, CUDA streams, resets, batch sizes and weight changes.  Graph outputs
are poisoned with NaN before every push, so a replay that leaves a sample unwritten fails.  Skipped
without CUDA."""

import pytest
import torch

from tests.test_codec_streaming import TINY, random_codes, snr_db
from tests.tiny import random_dac_weights
from zonos.codec import DACAutoencoder, DACConfig, StreamingDACDecoder
from zonos.codec.autoencoder import decode_precision
from zonos.ops.backend import REFERENCE, Backend, use_backend

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CONFIG = DACConfig(**dict(TINY, decoder_hidden_size=64))
HOP = 512


@pytest.fixture(scope="module")
def codec() -> DACAutoencoder:
    return DACAutoencoder(CONFIG, random_dac_weights(CONFIG), device="cuda")


@pytest.fixture
def exact():
    """Deterministic cuDNN algorithms without TF32: then a replay must equal the eager push bit for bit."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.deterministic
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.deterministic = flags


def _poison(dec: StreamingDACDecoder) -> None:
    for captured in dec.graphs.results():
        if captured.output is not None:
            captured.output.fill_(float("nan"))


def stream(dec: StreamingDACDecoder, codes: torch.Tensor, schedule: list[int]) -> torch.Tensor:
    """One whole stream (reset, pushes, flush) with every graph output poisoned before each call."""
    assert sum(schedule) == codes.shape[-1]
    dec.reset()
    outs, n = [], 0
    for size in schedule:
        _poison(dec)
        outs.append(dec.push(codes[..., n : n + size]))
        n += size
        assert dec.samples_emitted == max(0, HOP * n - 4757)
    _poison(dec)
    outs.append(dec.flush())
    out = torch.cat(outs, dim=-1)
    assert out.shape == (codes.shape[0], 1, HOP * codes.shape[-1]) and out.dtype == torch.float32
    assert not out.isnan().any()
    return out


def one_shot(codec: DACAutoencoder, codes: torch.Tensor, fp16: bool) -> torch.Tensor:
    """The one-shot decode; in fp32 without TF32."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32 and fp16
    try:
        with torch.no_grad(), decode_precision(codes.device, fp16):
            return codec.dac.decode(codes).float()
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


def close_to_one_shot(codec: DACAutoencoder, codes: torch.Tensor, out: torch.Tensor, fp16: bool) -> None:
    """fp32: ≥ 90 dB from the one-shot decode.  fp16 autocast: as close to the fp32 decode as the fp16
    one-shot decode is (within 6 dB): fp16 rounding, not streaming, sets the error."""
    truth = one_shot(codec, codes, fp16=False)
    if fp16:
        assert snr_db(out, truth) >= snr_db(one_shot(codec, codes, fp16=True), truth) - 6
    else:
        assert snr_db(out, truth) >= 90


def codes_(batch: int, frames: int, seed: int) -> torch.Tensor:
    return random_codes(batch, frames, seed).cuda()


SCHEDULES = {
    "11_then_2s": [11] + [2] * 10,
    "11_then_4s": [11] + [4] * 6,
    "11_then_8s": [11] + [8] * 4,
    "odd_total": [11] + [3] * 5 + [2],
    "ones": [1] * 24,
    "fives": [5] * 6 + [4],
}


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", SCHEDULES)
def test_graphs_equal_eager(codec, exact, fp16, name):
    """Stream 1 captures the repeated steady size, stream 2 the first pushes and the flush; from
    stream 3 on every call is a replay.  All equal the eager decoder."""
    schedule = SCHEDULES[name]
    eager = StreamingDACDecoder(codec, fp16_autocast=fp16, cuda_graphs=False)
    graphed = StreamingDACDecoder(codec, fp16_autocast=fp16)
    for seed in range(4):
        codes = codes_(2, sum(schedule), seed)
        replays, captures = graphed.graph_replays, graphed.graph_captures
        out = stream(graphed, codes, schedule)
        assert torch.equal(out, stream(eager, codes, schedule))
        close_to_one_shot(codec, codes, out, fp16)
    assert graphed.graph_replays - replays == len(schedule) + 1  # the last stream: all replays
    assert graphed.graph_captures == captures > 0
    assert eager.graph_captures == eager.graph_replays == 0


def test_default_precision_and_cudnn_settings(codec):
    """As the TTS path runs it (fp16 autocast, TF32 and cuDNN's default algorithms)."""
    schedule = [12] + [8] * 5
    graphed = StreamingDACDecoder(codec)
    eager = StreamingDACDecoder(codec, cuda_graphs=False)
    for seed in range(3):
        codes = codes_(1, sum(schedule), 30 + seed)
        out = stream(graphed, codes, schedule)
        close_to_one_shot(codec, codes, out, fp16=True)
        ref = stream(eager, codes, schedule)
        assert torch.equal(out, ref) or snr_db(out, ref) >= 50  # cuDNN may pick nondeterministic algorithms
    assert graphed.graph_replays >= len(schedule) + 1


def test_one_off_sizes_are_not_captured(codec, exact):
    """The first run of a key stays eager: a stream's last partial chunk costs no capture."""
    graphed = StreamingDACDecoder(codec, fp16_autocast=False)
    graphed_codes = codes_(1, 31, 40)
    # A push's key is the state's shapes, which the previous push's size sets: the 4-frame push after a
    # 4-frame push recurs (captured at its second occurrence, replayed at its third); the others do not.
    stream(graphed, graphed_codes, [11, 4, 4, 4, 4, 3, 1])
    assert graphed.graph_captures == 1
    assert graphed.graph_replays == 1


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_side_streams_and_cancel(codec, exact, fp16):
    """Captured on one request's side stream, replayed on the next requests' (new) side streams and
    on the default stream; a stream cancelled mid-way (reset on the default stream) leaves the
    graphs valid."""
    schedule = [11] + [4] * 6
    eager = StreamingDACDecoder(codec, fp16_autocast=fp16, cuda_graphs=False)
    graphed = StreamingDACDecoder(codec, fp16_autocast=fp16)
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):  # a request that is cancelled after a few chunks
        graphed.reset()
        partial = codes_(1, 27, 50)
        for start, size in [(0, 11), (11, 4), (15, 4), (19, 4), (23, 4)]:
            graphed.push(partial[..., start : start + size])
    assert graphed.graph_captures == 1 and graphed.graph_replays == 1
    graphed.reset()  # the cancel, on the main stream as in zonos/streaming.py
    for i, where in enumerate([torch.cuda.Stream(), torch.cuda.Stream(), None, torch.cuda.Stream()]):
        codes = codes_(1, sum(schedule), 51 + i)
        if where is None:
            out = stream(graphed, codes, schedule)
        else:
            where.wait_stream(main)
            with torch.cuda.stream(where):
                out = stream(graphed, codes, schedule)
            main.wait_stream(where)
        assert torch.equal(out, stream(eager, codes, schedule)), i
    assert graphed.graph_replays >= len(schedule) + 1 + 5


def test_batch_sizes_keep_their_graphs(codec, exact):
    schedule = [12, 4, 4, 4, 3]
    eager = StreamingDACDecoder(codec, fp16_autocast=False, cuda_graphs=False)
    graphed = StreamingDACDecoder(codec, fp16_autocast=False)
    captures = []
    for i, batch in enumerate([2, 1, 2, 1, 2, 1, 3]):
        codes = codes_(batch, sum(schedule), 60 + i)
        assert torch.equal(stream(graphed, codes, schedule), stream(eager, codes, schedule)), batch
        captures.append(graphed.graph_captures)
    assert captures[4] == captures[5] == captures[3]  # batches 1 and 2 replay what they captured


def test_push_latent_graphs(codec, exact):
    eager = StreamingDACDecoder(codec, fp16_autocast=False, cuda_graphs=False)
    graphed = StreamingDACDecoder(codec, fp16_autocast=False)
    for seed in range(3):
        latent = torch.randn(
            1, CONFIG.hidden_size, 27, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)
        )
        outs = {}
        for name, dec in (("eager", eager), ("graphed", graphed)):
            dec.reset()
            _poison(dec)
            parts = [dec.push_latent(latent[..., :11])]
            for s in range(11, 27, 4):
                _poison(dec)
                parts.append(dec.push_latent(latent[..., s : s + 4]))
            _poison(dec)
            outs[name] = torch.cat(parts + [dec.flush()], dim=-1)
        assert torch.equal(outs["graphed"], outs["eager"])
    assert graphed.graph_replays >= 6


@pytest.fixture(params=["torch", "triton"])
def conv_ops(request) -> Backend:
    """The backend for the decoder's convs: cuDNN (the references), or our Triton kernels (which pack the weights
    and cache the copies)."""
    if request.param == "torch":
        return REFERENCE
    from zonos_accel.triton import triton_backend

    return triton_backend(REFERENCE, ("conv1d", "conv_transpose1d", "sequence_tail", "snake"))


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_weights_changed_in_place_or_moved(exact, fp16, conv_ops):
    """Weights changed in place between streams, or moved to new storage, drop the graphs, which are captured
    again: the next streams equal an eager decoder's on the new weights."""
    codec = DACAutoencoder(CONFIG, random_dac_weights(CONFIG, seed=1), device="cuda")
    use_backend(codec.dac, conv_ops)
    schedule = [11] + [4] * 5
    eager = StreamingDACDecoder(codec, fp16_autocast=fp16, cuda_graphs=False)
    graphed = StreamingDACDecoder(codec, fp16_autocast=fp16)

    def check(seed):
        codes = codes_(1, sum(schedule), seed)
        assert torch.equal(stream(graphed, codes, schedule), stream(eager, codes, schedule))

    for seed in range(3):
        check(70 + seed)
    captures = graphed.graph_captures
    with torch.no_grad():
        codec.dac.decoder.block[1].res_unit2.conv1.weight.mul_(1.5)
        codec.dac.decoder.conv1.bias.add_(0.1)
    for seed in range(2):
        check(80 + seed)
    assert graphed.graph_captures == 2 * captures
    codec.to("cpu").to("cuda")
    for seed in range(3):
        check(90 + seed)
    assert graphed.graph_captures == 3 * captures


def test_gpu_codes_out_of_range_raise_at_flush(codec, exact):
    """Code values of CUDA codes are checked on the GPU (no host sync per push): a replayed push with an
    out-of-range code returns (clamped, invalid) audio, flush names the range, and after reset the next stream
    equals a fresh decoder's."""
    schedule = [11, 4, 4, 4, 4]
    graphed = StreamingDACDecoder(codec, fp16_autocast=False)
    for seed in range(3):  # captures the 4-frame push
        stream(graphed, codes_(1, sum(schedule), 50 + seed), schedule)
    codes = codes_(1, sum(schedule), 60)
    bad = codes.clone()
    bad[0, 3, 20] = 1025  # a MASK code, in the third 4-frame push (a replay)
    graphed.reset()
    replays = graphed.graph_replays
    n = 0
    for size in schedule:
        graphed.push(bad[..., n : n + size])
        n += size
    assert graphed.graph_replays > replays
    with pytest.raises(ValueError, match=r"reset\(\).*0\.\.1023; got values in 0\.\.1025"):
        graphed.flush()
    fresh = StreamingDACDecoder(codec, fp16_autocast=False, cuda_graphs=False)
    assert torch.equal(stream(graphed, codes, schedule), stream(fresh, codes, schedule))
    negative = codes.clone()
    negative[0, 0, 0] = -1
    graphed.reset()
    graphed.push(negative)
    with pytest.raises(ValueError, match=r"got values in -1\.\."):
        graphed.flush()


def test_decoders_on_two_cuda_streams_keep_apart(exact, monkeypatch):
    """Two streams decoded at once on two CUDA streams, on our Triton convs with every reduction split (their
    counters) and the windows handing their convs prepared operands: each decoder's ops keep that working memory in
    its own scratch, so each stream equals the same stream decoded alone."""
    from zonos_accel.triton import triton_backend
    from zonos_accel.triton import vocoder as fast

    monkeypatch.setattr(fast, "_split", lambda n_groups, tiles, device: n_groups > 1)
    codec = DACAutoencoder(CONFIG, random_dac_weights(CONFIG, seed=2), device="cuda")
    use_backend(codec.dac, triton_backend(REFERENCE, ("conv1d", "conv_transpose1d", "sequence_tail", "snake")))
    schedule = [11] + [2] * 8
    codes = [codes_(1, sum(schedule), 100 + i) for i in range(2)]
    alone = [stream(StreamingDACDecoder(codec, fp16_autocast=True, cuda_graphs=False), c, schedule) for c in codes]
    decoders = [StreamingDACDecoder(codec, fp16_autocast=True, cuda_graphs=False) for _ in codes]
    sides = [torch.cuda.Stream() for _ in codes]
    main = torch.cuda.current_stream()
    outs: list[list[torch.Tensor]] = [[], []]
    start = 0
    for size in schedule:  # each push launched on its side stream while the other's may still run
        for i in range(2):
            sides[i].wait_stream(main)
            with torch.cuda.stream(sides[i]):
                outs[i].append(decoders[i].push(codes[i][..., start : start + size]))
        start += size
    for i in range(2):
        with torch.cuda.stream(sides[i]):
            outs[i].append(decoders[i].flush())
        main.wait_stream(sides[i])
    for i in range(2):
        assert torch.equal(torch.cat(outs[i], dim=-1), alone[i]), i
