"""Streaming on a GPU (bf16 model, fp16-autocast vocoder on a side stream): streamed codes equal one-shot
codes, streamed audio equals the one-shot decode to ≥ 60 dB. Skipped without CUDA."""

import pytest
import torch

from tests.test_model import _save
from zonos.codec.autoencoder import DACAutoencoder
from zonos.codec.dac import DACConfig
from zonos.model import Zonos

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    codec = DACAutoencoder(DACConfig(encoder_hidden_size=4, decoder_hidden_size=64, hidden_size=64), device="cuda")
    paths = _save(tmp_path_factory.mktemp("hybrid"), "hybrid")
    return Zonos.from_local(*paths, device="cuda", dtype=torch.bfloat16, autoencoder=codec, max_seqlen=256)


@pytest.mark.parametrize("first,steady", [(1, 1), (1, 3), (2, 8), (5, 7)])
def test_gpu_stream_equals_one_shot(model, first, steady):
    prefix = torch.randn(2, 40, 64, device="cuda", dtype=torch.bfloat16)

    def run(**kw):
        gen = torch.Generator(device="cuda").manual_seed(11)
        return model.generate(prefix, max_new_tokens=40, progress_bar=False, generator=gen, **kw)

    codes = run()
    chunks = list(run(stream=True, first_chunk_frames=first, chunk_frames=steady))
    assert all(c.audio.device.type == "cpu" for c in chunks)
    assert torch.equal(torch.cat([c.codes for c in chunks], -1), codes)
    ref = model.autoencoder.decode(codes).cpu()
    audio = torch.cat([c.audio for c in chunks], -1)
    assert audio.shape == ref.shape
    snr = 10 * torch.log10(ref.pow(2).sum() / (ref - audio).pow(2).sum().clamp_min(1e-30))
    assert snr >= 60, f"{snr:.1f} dB"
