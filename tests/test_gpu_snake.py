"""The Triton Snake (zonos_accel/triton/snake.py) on the GPU: close to the float64 reference at the DAC
decoder's shapes and equal to torch's result bit for bit (both compute in fp32 with the same roundings); and
the streaming decoder with it, eager and replayed from CUDA graphs, still matching the one-shot decode.
Skipped without CUDA."""

import pytest
import torch

from tests.test_codec_streaming import random_codes
from tests.test_gpu_vocoder import close_to_one_shot, exact, stream  # noqa: F401 (exact: a fixture)
from tests.tiny import random_dac_weights
from zonos.codec import DACAutoencoder, DACConfig, StreamingDACDecoder
from zonos.ops.backend import REFERENCE, use_backend
from zonos.ops.snake import snake as reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def fast():
    from zonos_accel.triton import fast_op

    return fast_op("snake")


@pytest.mark.parametrize("channels", [1536, 768, 384, 192, 96])
@pytest.mark.parametrize("length", [1, 7, 64, 513, 4097])
@pytest.mark.parametrize(
    "dtype,out_dtype",
    [(torch.float32, None), (torch.float16, None), (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16)],
)
def test_matches_reference(fast, channels, length, dtype, out_dtype):
    g = torch.Generator("cuda").manual_seed(channels + length)
    x = (3 * torch.randn(2, channels, length, device="cuda", generator=g)).to(dtype)
    alpha = 0.3 + 1.7 * torch.rand(1, channels, 1, device="cuda", generator=g)
    alpha[0, 0, 0] = 0.0
    out = fast(x, alpha, out_dtype)
    assert out.dtype == (out_dtype or torch.float32) and out.shape == x.shape
    ref = reference(x.double(), alpha.double())
    # fp32 math: alpha * x rounded moves sin's argument by up to |alpha x| eps / 2, hence the result by up to
    # |x| eps / 2; the other roundings and the final one to the output dtype add a few ulps of the result.
    tol = torch.finfo(torch.float32).eps * x.double().abs() + torch.finfo(out.dtype).eps * (2 * ref.abs() + 1)
    assert ((out.double() - ref).abs() <= tol).all()
    assert torch.equal(out, reference(x, alpha, out_dtype))


def test_out_view_of_a_history_buffer(fast):
    x = torch.randn(1, 768, 37, device="cuda", dtype=torch.float16)
    alpha = 0.3 + 1.7 * torch.rand(1, 768, 1, device="cuda")
    buf = torch.full((1, 768, 18 + 37), float("nan"), device="cuda", dtype=torch.float16)
    assert fast(x, alpha, out=buf[..., 18:]) is not None
    assert buf[..., :18].isnan().all()
    assert torch.equal(buf[..., 18:], reference(x, alpha, torch.float16))


@pytest.fixture(scope="module")
def codec() -> DACAutoencoder:
    config = DACConfig()  # full size: the channels and lengths the kernel meets in use
    return DACAutoencoder(config, random_dac_weights(config), device="cuda")


@pytest.fixture
def triton_snake(codec):
    """The codec's Snake on our Triton kernel (the other ops on the references) for the test, then the
    references again."""
    from zonos_accel.triton import triton_backend

    backend = triton_backend(REFERENCE, ("snake",))
    use_backend(codec.dac, backend)
    yield backend
    use_backend(codec.dac, REFERENCE)


@pytest.mark.usefixtures("exact")
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_streaming_decoder_with_triton_snake(codec, triton_snake, fp16):
    """Replays equal the eager pushes, the stream matches the one-shot decode as in tests/test_gpu_vocoder.py,
    and both equal the decoder on torch's Snake bit for bit."""
    schedule = [11, 2, 2, 8, 8, 1, 3]
    graphed = StreamingDACDecoder(codec, fp16_autocast=fp16)
    eager = StreamingDACDecoder(codec, fp16_autocast=fp16, cuda_graphs=False)
    for seed in range(3):
        codes = random_codes(1, sum(schedule), seed).cuda()
        replays = graphed.graph_replays
        out = stream(graphed, codes, schedule)
        assert torch.equal(out, stream(eager, codes, schedule))
        close_to_one_shot(codec, codes, out, fp16)
    assert graphed.graph_replays - replays == len(schedule) + 1  # the last stream: all replays
    use_backend(codec.dac, REFERENCE)
    try:
        assert torch.equal(out, stream(StreamingDACDecoder(codec, fp16_autocast=fp16), codes, schedule))
    finally:
        use_backend(codec.dac, triton_snake)
