"""DAC codec: parity with transformers' DacModel, checkpoint layout and loading, input checks, audio I/O.

Everything runs on CPU with a tiny random DAC (same strides as the real one, few channels).
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tiny import TINY_DAC, random_dac_weights
from zonos import audio as audio_module
from zonos.audio import load_audio, resample, save_audio
from zonos.codec import (
    DAC,
    CheckpointMismatchError,
    CodecNotAvailableError,
    DACAutoencoder,
    DACConfig,
    convert_descript_state_dict,
)
from zonos.codec import autoencoder as autoencoder_module
from zonos.codec.autoencoder import encoder_context_frames
from zonos.errors import CheckpointError, ZonosInputError

DATA = Path(__file__).parent / "data"

TINY = TINY_DAC


def snr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    err = (x.double() - ref.double()).pow(2).sum()
    return float("inf") if err == 0 else float(10 * torch.log10(ref.double().pow(2).sum() / err))


@pytest.fixture(scope="module")
def tiny_weights() -> dict[str, torch.Tensor]:
    return random_dac_weights(DACConfig(**TINY))


@pytest.fixture(scope="module")
def codec(tiny_weights) -> DACAutoencoder:
    return DACAutoencoder(DACConfig(**TINY), tiny_weights)


@pytest.fixture(scope="module")
def hf_dac(tiny_weights):
    transformers = pytest.importorskip("transformers")
    model = transformers.DacModel(transformers.DacConfig(**TINY)).eval()
    model.load_state_dict(tiny_weights, strict=True)
    return model


# -- parity with transformers ------------------------------------------------------------------


def test_decode_matches_transformers(codec, hf_dac):
    codes = torch.randint(0, 1024, (2, 9, 13), generator=torch.Generator().manual_seed(1))
    ours = codec.decode(codes)
    with torch.no_grad():
        theirs = hf_dac.decode(audio_codes=codes).audio_values
    assert ours.shape == (2, 1, 13 * 512) and ours.dtype == torch.float32
    assert (ours.abs() < 0.9).float().mean() > 0.9  # tanh mostly unsaturated: the comparison means something
    assert snr_db(ours[:, 0], theirs) >= 60.0


def test_encode_matches_transformers(codec, hf_dac):
    wav = 0.3 * torch.randn(2, 1, 512 * 12, generator=torch.Generator().manual_seed(2))
    codes = codec.encode(wav)
    with torch.no_grad():
        out = hf_dac.encode(wav)
    assert codes.dtype == torch.int64 and codes.shape == (2, 9, 12)
    assert torch.equal(codes, out.audio_codes)
    # The latent that the codes stand for matches too.
    latent = codec.dac.codes_to_latent(codes)
    assert torch.allclose(latent, hf_dac.quantizer.from_codes(codes)[0], atol=1e-5)


# -- checkpoint layout -------------------------------------------------------------------------


def test_state_dict_matches_reference_layout():
    config = DACConfig.from_json(DATA / "dac_44khz_config.json")
    assert (config.sampling_rate, config.hop_length, config.n_codebooks, config.codebook_size) == (44100, 512, 9, 1024)
    with torch.device("meta"):
        model = DAC(config)
    ours = {k: "x".join(map(str, v.shape)) for k, v in model.state_dict().items()}
    lines = (DATA / "dac_44khz_state_dict.tsv").read_text().splitlines()[1:]
    reference = {name: shape for name, shape, _ in (line.split("\t") for line in lines)}
    assert ours == reference
    assert len(ours) == 223
    assert sum(p.numel() for p in model.parameters()) == 76_620_777


def test_config_from_dict_ignores_unknown_keys_and_checks_hop():
    config = DACConfig.from_dict({**TINY, "commitment_loss_weight": 0.25, "model_type": "dac", "hop_length": 512})
    assert config.hidden_size == 64 and config.hop_length == 512
    with pytest.raises(ValueError, match="hop_length"):
        DACConfig.from_dict({**TINY, "hop_length": 256})


def test_save_and_from_local_round_trip(codec, tmp_path):
    codec.save_pretrained(tmp_path)
    loaded = DACAutoencoder.from_local(tmp_path)
    assert loaded.config == codec.config
    for (k, a), (k2, b) in zip(codec.dac.state_dict().items(), loaded.dac.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    # A local directory also works as from_pretrained's repo_id.
    assert DACAutoencoder.from_pretrained(str(tmp_path)).config == codec.config
    codes = torch.randint(0, 1024, (1, 9, 3))
    assert torch.equal(loaded.decode(codes), codec.decode(codes))


def test_saved_directory_loads_in_transformers(codec, tmp_path):
    transformers = pytest.importorskip("transformers")
    codec.save_pretrained(tmp_path)
    model = transformers.DacModel.from_pretrained(tmp_path).eval()
    codes = torch.randint(0, 1024, (1, 9, 3))
    with torch.no_grad():
        theirs = model.decode(audio_codes=codes).audio_values
    assert snr_db(codec.decode(codes)[:, 0], theirs) >= 60.0


# -- Descript's original checkpoint format -----------------------------------------------------

_RU = ("snake1", "conv1", "snake2", "conv2")


def _descript_name(name: str) -> str:
    """Descript's nn.Sequential path for one of our parameter names (test-side inverse mapping)."""
    p = name.split(".")
    if p[0] == "quantizer":
        return name
    if p[0] == "encoder":
        top = {"conv1": "0", "snake1": "5", "conv2": "6"}
        if p[1] in top:
            return ".".join(["encoder.block", top[p[1]], *p[2:]])
        i, part = int(p[2]), p[3]
        if part.startswith("res_unit"):
            inner = ["block", str(int(part[-1]) - 1), "block", str(_RU.index(p[4])), *p[5:]]
        else:
            inner = ["block", {"snake1": "3", "conv1": "4"}[part], *p[4:]]
        return ".".join(["encoder.block", str(i + 1), *inner])
    top = {"conv1": "0", "snake1": "5", "conv2": "6"}
    if p[1] in top:
        return ".".join(["decoder.model", top[p[1]], *p[2:]])
    j, part = int(p[2]), p[3]
    if part.startswith("res_unit"):
        inner = ["block", str(int(part[-1]) + 1), "block", str(_RU.index(p[4])), *p[5:]]
    else:
        inner = ["block", {"snake1": "0", "conv_t1": "1"}[part], *p[4:]]
    return ".".join(["decoder.model", str(j + 1), *inner])


def _legacy_state_dict(weights: dict[str, torch.Tensor], parametrized: bool = False) -> dict[str, torch.Tensor]:
    """Descript-style tensors: every conv weight split into weight_g / weight_v (v = w * random scale)."""
    g_name, v_name = (
        ("parametrizations.weight.original0", "parametrizations.weight.original1")
        if parametrized
        else ("weight_g", "weight_v")
    )
    gen = torch.Generator().manual_seed(5)
    out = {}
    for name, t in weights.items():
        legacy = _descript_name(name)
        if name.endswith(".weight") and t.dim() == 3:
            base = legacy[: -len(".weight")]
            scale = 0.5 + torch.rand((t.shape[0],) + (1,) * (t.dim() - 1), generator=gen)
            out[f"{base}.{g_name}"] = t.flatten(1).norm(dim=1).reshape(scale.shape)
            out[f"{base}.{v_name}"] = t * scale
        else:
            out[legacy] = t
    return out


@pytest.mark.parametrize("parametrized", [False, True])
def test_convert_descript_state_dict(tiny_weights, parametrized):
    legacy = _legacy_state_dict(tiny_weights, parametrized)
    assert "decoder.model.1.block.1.weight_v" in legacy or parametrized
    converted = convert_descript_state_dict({"state_dict": legacy}, num_blocks=4)
    assert set(converted) == set(tiny_weights)
    for k, v in tiny_weights.items():
        torch.testing.assert_close(converted[k], v, rtol=1e-5, atol=1e-6)


def test_from_descript_checkpoint(codec, tiny_weights, tmp_path):
    kwargs = dict(
        encoder_dim=4,
        encoder_rates=[2, 4, 8, 8],
        latent_dim=64,
        decoder_dim=32,
        decoder_rates=[8, 8, 4, 2],
        n_codebooks=9,
        codebook_size=1024,
        codebook_dim=8,
        sample_rate=44100,
    )
    path = tmp_path / "weights.pth"
    torch.save({"state_dict": _legacy_state_dict(tiny_weights), "metadata": {"kwargs": kwargs}}, path)
    loaded = DACAutoencoder.from_descript_checkpoint(path)
    assert loaded.config == codec.config
    codes = torch.randint(0, 1024, (1, 9, 4))
    assert snr_db(loaded.decode(codes), codec.decode(codes)) >= 100.0


# -- input validation and clear errors ---------------------------------------------------------


def test_mismatched_checkpoint_lists_every_problem(tiny_weights):
    bad = dict(tiny_weights)
    del bad["decoder.conv1.bias"]
    bad["decoder.extra.weight"] = torch.zeros(1)
    bad["encoder.conv1.weight"] = torch.zeros(5, 1, 7)
    with pytest.raises(CheckpointMismatchError) as info:
        DACAutoencoder(DACConfig(**TINY), bad)
    msg = str(info.value)
    assert "decoder.conv1.bias" in msg and "decoder.extra.weight" in msg and "encoder.conv1.weight" in msg
    assert "(5, 1, 7)" in msg and "(4, 1, 7)" in msg


def test_from_local_missing_files(tmp_path):
    with pytest.raises(CodecNotAvailableError, match="model.safetensors"):
        DACAutoencoder.from_local(tmp_path)


def test_decode_rejects_bad_codes(codec):
    with pytest.raises(ValueError, match="EOS 1024.*with 0"):
        codec.decode(torch.full((1, 9, 2), 1024))
    with pytest.raises(ValueError, match="0..1023"):
        codec.decode(torch.full((1, 9, 2), -1))
    with pytest.raises(ZonosInputError, match="integer"):
        codec.decode(torch.zeros(1, 9, 2))
    with pytest.raises(ValueError, match=r"\[B, 9, T\]"):
        codec.decode(torch.zeros(9, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[B, 9, T\]"):
        codec.decode(torch.zeros(1, 8, 2, dtype=torch.long))
    assert codec.decode(torch.zeros(2, 9, 0, dtype=torch.long)).shape == (2, 1, 0)


def test_encode_rejects_bad_audio(codec):
    with pytest.raises(ValueError, match=r"\[B, 1, N\]"):
        codec.encode(torch.zeros(1, 1024))
    with pytest.raises(ValueError, match="preprocess"):
        codec.encode(torch.zeros(1, 1, 1000))
    with pytest.raises(ZonosInputError, match="floating"):
        codec.encode(torch.zeros(1, 1, 1024, dtype=torch.long))


def test_offline_hub_without_cache_gives_clear_error(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CodecNotAvailableError) as info:
        DACAutoencoder.from_pretrained(cache_dir=tmp_path / "cache")
    msg = str(info.value)
    assert "descript/dac_44khz" in msg and "hf download" in msg and "from_local" in msg


def test_from_pretrained_uses_hub_files(codec, tmp_path, monkeypatch):
    import huggingface_hub

    codec.save_pretrained(tmp_path)
    asked = []

    def fake_download(repo_id, filename, revision=None, cache_dir=None):
        asked.append((repo_id, filename, revision))
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    loaded = DACAutoencoder.from_pretrained(revision="abc")
    assert loaded.config == codec.config
    assert asked == [("descript/dac_44khz", "config.json", "abc"), ("descript/dac_44khz", "model.safetensors", "abc")]


def test_autoencoder_attributes(codec):
    assert (codec.sampling_rate, codec.codebook_size, codec.num_codebooks, codec.hop_length) == (44100, 1024, 9, 512)
    assert codec.to("cpu") is codec and codec.device == torch.device("cpu")
    assert not any(p.requires_grad for p in codec.dac.parameters())


# -- preprocessing, resampling, audio files ----------------------------------------------------


def test_preprocess_pads_to_hop(codec):
    wav = torch.randn(1, 1, 44100 + 5)
    out = codec.preprocess(wav, 44100)
    assert out.shape[-1] == 512 * math.ceil((44100 + 5) / 512)
    assert torch.equal(out[..., : wav.shape[-1]], wav) and not out[..., wav.shape[-1] :].any()
    out = codec.preprocess(torch.randn(1, 1, 16000), 16000)  # 1 s at 16 kHz -> 44100 samples -> padded
    assert out.shape[-1] == 512 * math.ceil(44100 / 512)
    assert codec.encode(out).shape == (1, 9, out.shape[-1] // 512)


@pytest.mark.parametrize(
    ("orig", "new", "n"), [(16000, 44100, 1601), (48000, 44100, 4800), (44100, 24000, 999), (8000, 16000, 7)]
)
def test_resample_length_matches_torchaudio_rule(orig, new, n):
    assert resample(torch.randn(2, n), orig, new).shape == (2, math.ceil(n * new / orig))


def test_resample_identity_when_rates_equal():
    wav = torch.randn(3, 100)
    assert resample(wav, 24000, 24000) is wav


@pytest.mark.parametrize(("orig", "new"), [(16000, 44100), (48000, 44100), (24000, 44100)])
def test_resample_keeps_sine_frequency_and_amplitude(orig, new):
    freq, amp = 440.0, 0.5
    n = orig // 2
    wav = amp * torch.sin(2 * math.pi * freq * torch.arange(n, dtype=torch.float64) / orig)
    out = resample(wav, orig, new)
    t = torch.arange(out.shape[-1], dtype=torch.float64) / new
    expected = amp * torch.sin(2 * math.pi * freq * t)
    core = slice(200, out.shape[-1] - 200)  # away from the zero-padded edges
    assert (out[core] - expected[core]).abs().max() < 5e-3
    spectrum = np.abs(np.fft.rfft(out[core].numpy()))
    peak_hz = np.argmax(spectrum) * new / len(out[core])
    assert abs(peak_hz - freq) < new / len(out[core])


def test_resample_matches_direct_windowed_sinc():
    """The polyphase implementation equals the textbook sum y[j] = sum_i x[i] h(i - j * orig / new)."""
    orig, new, width_zc, rolloff = 3, 2, 6, 0.99  # rates already coprime
    x = torch.randn(50, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    y = resample(x, orig, new)
    cutoff = min(orig, new) * rolloff
    expected = []
    for j in range(y.shape[0]):
        d = (torch.arange(50, dtype=torch.float64) / orig - j / new) * cutoff
        d = d.clamp(-width_zc, width_zc)
        h = torch.where(d == 0, torch.ones_like(d), torch.sin(math.pi * d) / (math.pi * d))
        h = h * torch.cos(math.pi * d / (2 * width_zc)) ** 2 * cutoff / orig
        expected.append((h * x).sum())
    torch.testing.assert_close(y, torch.stack(expected), rtol=1e-10, atol=1e-10)


def test_resample_batch_shape_and_dtype():
    wav = torch.randn(2, 1, 300, dtype=torch.float32)
    out = resample(wav, 22050, 44100)
    assert out.shape == (2, 1, 600) and out.dtype == torch.float32


def test_save_and_load_audio_round_trip(tmp_path):
    pytest.importorskip("soundfile")
    wav = 0.5 * torch.sin(torch.linspace(0, 100, 2000)).repeat(2, 1)
    save_audio(tmp_path / "a.wav", wav, 16000, subtype="FLOAT")
    loaded, sr = load_audio(tmp_path / "a.wav")
    assert sr == 16000 and loaded.shape == (2, 2000) and loaded.dtype == torch.float32
    torch.testing.assert_close(loaded, wav)
    save_audio(tmp_path / "b.wav", 2 * wav[:1], 16000)  # PCM_16: clipped, not wrapped
    loaded, _ = load_audio(tmp_path / "b.wav")
    assert loaded.max() <= 1.0 and loaded.max() > 0.99


def test_load_audio_errors(tmp_path):
    pytest.importorskip("soundfile")
    with pytest.raises(FileNotFoundError):
        load_audio(tmp_path / "missing.wav")
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"this is not audio")
    with pytest.raises(ZonosInputError, match="could not read .*bad.wav as audio"):
        load_audio(bad)
    with pytest.raises(ZonosInputError, match="could not read the upload as audio"):
        load_audio(io.BytesIO(b"RIFF not audio"), name="the upload")
    for bad in (float("nan"), float("inf"), "30", 0, True):
        with pytest.raises(ZonosInputError, match="max_seconds must be a positive number"):
            load_audio(bad_path := tmp_path / "bad.wav", max_seconds=bad)
    assert bad_path.exists()


def test_load_audio_decodes_at_most_max_seconds(tmp_path):
    """A small compressed file can hold hours: 20 minutes of a constant is a few KB of FLAC and 38 MB decoded. With
    max_seconds only that much is decoded (peak allocation measured by tracemalloc, which numpy reports to); the
    header's rate is checked before anything is decoded."""
    import tracemalloc

    sf = pytest.importorskip("soundfile")
    path = tmp_path / "long.flac"
    with sf.SoundFile(path, "w", 8000, 1, "PCM_16", format="FLAC") as f:
        for _ in range(20 * 60 // 10):
            f.write(np.full(80_000, 0.1, dtype=np.float32))
    assert path.stat().st_size < 200_000
    tracemalloc.start()
    try:
        wav, sr = load_audio(path, max_seconds=2.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sr == 8000 and wav.shape == (1, 16_000) and abs(float(wav.mean()) - 0.1) < 1e-3
    assert peak < 2_000_000, peak  # the whole file would be 38 MB
    data = io.BytesIO()
    sf.write(data, np.zeros(2000, np.float32), 1, format="WAV", subtype="FLOAT")  # 8 KB claiming 1 Hz
    with pytest.raises(ZonosInputError, match="the upload: sample rate 1 Hz is outside 8000..768000 Hz"):
        load_audio(io.BytesIO(data.getvalue()), name="the upload")


def test_codes_to_latent_is_the_sum_of_every_stage(codec):
    """The one conv over the stacked codebook rows equals the sum of each stage's out_proj(codebook row)."""
    dac = codec.dac.double()
    try:
        codes = torch.randint(0, dac.config.codebook_size, (2, dac.config.n_codebooks, 7))
        expected = sum(
            vq.out_proj(vq.codebook(codes[:, q]).transpose(1, 2)) for q, vq in enumerate(dac.quantizer.quantizers)
        )
        torch.testing.assert_close(dac.codes_to_latent(codes), expected, rtol=1e-12, atol=1e-12)
        assert dac.codes_to_latent(codes[:, :3]).shape == expected.shape  # fewer codebooks: the first ones
        with pytest.raises(ValueError, match=r"\[B, n_codebooks, T\]"):
            dac.codes_to_latent(codes[0])
        with pytest.raises(ValueError, match="codes have 10 codebooks"):
            dac.codes_to_latent(torch.zeros(1, 10, 2, dtype=torch.long))
    finally:
        dac.float()


def _stage_sum(dac, codes: torch.Tensor) -> torch.Tensor:
    return sum(vq.out_proj(vq.codebook(codes[:, q]).transpose(1, 2)) for q, vq in enumerate(dac.quantizer.quantizers))


def test_codes_to_latent_sees_every_weight_change(codec):
    """The stacked codebooks are kept between calls (a streaming push would stack them anew each time), yet a
    change to any of the weights they come from shows in the next call, and gradients still reach the weights."""
    dac = codec.dac
    codes = torch.randint(0, dac.config.codebook_size, (1, dac.config.n_codebooks, 5))
    vq = dac.quantizer.quantizers[4]
    params = (vq.codebook.weight, vq.out_proj.weight, vq.out_proj.bias)
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            first = dac.codes_to_latent(codes)
            assert dac._stacked_codebooks(dac.config.n_codebooks)[0] is dac._stacked_codebooks(9)[0]  # kept
            for p in params:
                p.add_(0.25)
                latent = dac.codes_to_latent(codes)
                torch.testing.assert_close(latent, _stage_sum(dac, codes), rtol=1e-5, atol=1e-5)
                assert not torch.equal(latent, first)
                first = latent
        requires = [p.requires_grad for p in params]
        for p in params:
            p.requires_grad_(True)
        try:
            dac.codes_to_latent(codes).sum().backward()
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
        finally:
            for p, r in zip(params, requires):
                p.requires_grad_(r)
                p.grad = None
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


def test_codebook_rows_clamps_and_tracks_the_range_when_asked():
    from zonos import ops

    tables = torch.randn(3 * 10, 4, dtype=torch.float64)
    codes = torch.tensor([[[0, 9, 3], [12, -2, 5], [7, 7, 1]]])
    bounds = torch.tensor([1, 8])  # folded into, not replaced
    rows = ops.codebook_rows(codes, tables, 10, bounds)
    assert bounds.tolist() == [-2, 12]
    clamped = codes.clamp(0, 9)
    for j in range(3):
        assert torch.equal(rows[0, 4 * j : 4 * j + 4], tables[10 * j + clamped[0, j]].T)
    assert torch.equal(ops.codebook_rows(clamped, tables, 10), rows)  # valid codes need no bounds
    for bad in (torch.zeros(2, dtype=torch.int32), torch.zeros(3, dtype=torch.long), torch.zeros(4).long()[::2]):
        with pytest.raises(ValueError, match="contiguous int64"):
            ops.codebook_rows(codes, tables, 10, bad)


# -- input validation and bounded cost ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_audio_is_refused(codec, bad):
    wav = 0.1 * torch.randn(1, 1, 1024)
    wav[0, 0, 100] = bad
    with pytest.raises(ZonosInputError, match="NaN or infinite"):
        codec.preprocess(wav, 44100)
    with pytest.raises(ZonosInputError, match="NaN or infinite"):
        codec.encode(wav)


@pytest.mark.parametrize("sr", [True, False, 1, 7999, 22050.5, "44100", None, float("nan"), 10**7])
def test_preprocess_refuses_bad_sample_rates(codec, sr):
    with pytest.raises(ZonosInputError, match="sample rate"):
        codec.preprocess(0.1 * torch.randn(1, 1, 1000), sr)


def test_preprocess_accepts_numpy_rates_and_rescales_int16_scaled_floats(codec):
    wav = 0.2 * torch.randn(1, 1, 4000, generator=torch.Generator().manual_seed(0))
    ref = codec.preprocess(wav, np.int64(16000))
    with pytest.warns(UserWarning, match="scaled like int16"):
        scaled = codec.preprocess(wav * 32767, 16000)
    assert torch.allclose(scaled, ref * (32767 / 32768), atol=1e-6)


def test_long_clip_is_encoded_in_windows_equal_to_one_pass(codec, monkeypatch):
    """The windowed encode gives exactly the one-pass codes, and no encoder call sees more than one window."""
    context = encoder_context_frames(codec.config)
    assert context == 9  # 4244 samples of receptive field either side at hop 512
    frames = 61
    wav = 0.3 * torch.randn(2, 1, 512 * frames, generator=torch.Generator().manual_seed(3))
    one_pass = codec.dac.encode(wav)
    monkeypatch.setattr(autoencoder_module, "ENCODE_CHUNK_FRAMES", 8)
    seen = []
    real_encode = codec.dac.encode
    monkeypatch.setattr(codec.dac, "encode", lambda x: seen.append(x.shape[-1]) or real_encode(x))
    windowed = codec.encode(wav)
    assert len(seen) == math.ceil(frames / 8) and max(seen) <= 512 * (8 + 2 * context)
    assert windowed.shape == one_pass.shape and torch.equal(windowed, one_pass)


def test_windows_without_enough_context_would_differ(codec, monkeypatch):
    """The receptive field is not overstated by much: a window with 2 frames less context changes codes."""
    wav = 0.3 * torch.randn(1, 1, 512 * 61, generator=torch.Generator().manual_seed(4))
    one_pass = codec.dac.encode(wav)
    monkeypatch.setattr(autoencoder_module, "ENCODE_CHUNK_FRAMES", 8)
    monkeypatch.setattr(autoencoder_module, "encoder_context_frames", lambda config: 1)
    assert not torch.equal(codec.encode(wav), one_pass)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.uint16, torch.uint32, torch.uint64])
def test_decode_accepts_codes_of_any_integer_dtype(codec, dtype):
    hi = 255 if dtype == torch.uint8 else 1023
    codes = torch.randint(0, hi + 1, (1, 9, 4), generator=torch.Generator().manual_seed(5))
    codes[0, 0, 0] = hi
    assert torch.equal(codec.decode(codes.to(dtype)), codec.decode(codes))


def test_corrupt_codec_weights_name_the_file(codec, tmp_path):
    codec.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="download it again") as info:
        DACAutoencoder.from_local(tmp_path)
    assert str(weights) in str(info.value)
    (tmp_path / "config.json").write_text('{"encoder_hidden_size": "64"')
    with pytest.raises(CheckpointError, match="not valid JSON") as info:
        DACAutoencoder.from_local(tmp_path)
    assert "config.json" in str(info.value)
    (tmp_path / "config.json").write_text('{"encoder_hidden_size": "64"}')
    with pytest.raises(CheckpointError, match="encoder_hidden_size must be an integer"):
        DACAutoencoder.from_local(tmp_path)


def test_nan_codec_weights_are_refused(tiny_weights):
    weights = dict(tiny_weights)
    weights["decoder.conv1.bias"] = torch.full_like(weights["decoder.conv1.bias"], float("nan"))
    with pytest.raises(CheckpointError, match="NaN or infinite values in 1 tensor.*decoder.conv1.bias"):
        DACAutoencoder(DACConfig(**TINY), weights)


def test_resample_gathers_taps_for_rates_with_a_small_gcd(monkeypatch):
    """Rates like 44101 Hz would need a 15 GB polyphase bank; the gathered taps give the bank's result."""
    x = torch.randn(2, 3000, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    for orig, new in [(44100, 16000), (16000, 44100), (48000, 16000), (8000, 44100)]:
        bank = resample(x, orig, new)
        monkeypatch.setattr(audio_module, "_MAX_BANK", 0)
        gathered = resample(x, orig, new)
        monkeypatch.undo()
        assert gathered.shape == bank.shape and torch.allclose(gathered, bank, atol=1e-12, rtol=0)
    t = torch.arange(44101 * 2, dtype=torch.float64) / 44101
    sine = torch.sin(2 * math.pi * 440 * t)
    out = resample(sine, 44101, 44100)  # would allocate 15 GB as a bank
    ref = torch.sin(2 * math.pi * 440 * torch.arange(out.shape[-1], dtype=torch.float64) / 44100)
    assert out.shape[-1] == math.ceil(len(sine) * 44100 / 44101)
    assert (out[200:-200] - ref[200:-200]).abs().max() < 1e-3
