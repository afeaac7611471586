"""Streaming on a GPU (bf16 model, fp16-autocast vocoder on a side stream): streamed codes equal one-shot
codes; streamed audio is as close to the fp32 decode as the fp16 one-shot decode is (fp16 rounding, not
streaming, sets the error). Skipped without CUDA."""

import pytest
import torch

from tests.test_gpu_vocoder import one_shot, snr_db
from tests.tiny import save_tiny_checkpoint
from zonos.codec.autoencoder import DACAutoencoder
from zonos.codec.dac import DACConfig
from zonos.codec.streaming import receptive_field
from zonos.model import Zonos
from zonos.streaming import ChunkAssembler

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    codec = DACAutoencoder(DACConfig(encoder_hidden_size=4, decoder_hidden_size=64, hidden_size=64), device="cuda")
    paths = save_tiny_checkpoint(tmp_path_factory.mktemp("hybrid"), "hybrid")
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
    assert torch.equal(torch.cat([c.codes for c in chunks], -1), codes.cpu())  # chunks hand out host tensors
    audio = torch.cat([c.audio for c in chunks], -1)
    fp16 = model.autoencoder.decode(codes).cpu()
    fp32 = one_shot(model.autoencoder, codes, fp16=False).cpu()
    assert audio.shape == fp16.shape
    assert snr_db(audio, fp32) >= snr_db(fp16, fp32) - 6, (snr_db(audio, fp16), snr_db(fp16, fp32))


def test_first_audio_is_not_held_for_a_step(model, monkeypatch):
    """With a vocoder per stream, the first chunk with audio is vocoded at the step whose frames complete it and
    handed out from that step (the engine waits for its audio instead of overlapping it with the next step, as it
    does for later chunks). The slab's first chunk waits for a tick's worth of audio (tests/test_streaming.py)."""
    prefix = torch.randn(2, 40, 64, device="cuda", dtype=torch.bfloat16)
    offsets, vocoded = [], []
    real = ChunkAssembler.vocode

    def vocode(self, final):
        vocoded.append(len(offsets))
        return real(self, final)

    monkeypatch.setattr(ChunkAssembler, "vocode", vocode)
    first = 2
    need = receptive_field(model.autoencoder.dac.config).lookahead_frames + first
    model.start_engine(vocoder_batching=False)
    try:
        stream = model.generate(
            prefix,
            max_new_tokens=40,
            progress_bar=False,
            stream=True,
            first_chunk_frames=first,
            callback=lambda frame, step, max_steps: offsets.append(step + 1) or True,
        )
        for chunk in stream:
            if chunk.audio.shape[-1]:
                break
        stream.close()
    finally:
        model.start_engine()  # the module's other tests run on the default engine
    steps = vocoded[0]  # decode steps run when the first chunk was vocoded
    complete = [max(o - 8, 0) for o in offsets[:steps]]  # frames whose 9 codebooks are written after each step
    assert complete[-1] >= need > complete[-2], offsets
