"""Speaker embedding: checkpoint layout, log-mel front end vs a numpy reference, a tiny network against a
functional reference, loading (local files, strict errors, offline hub) and input checks.

Everything runs on CPU; the network tests use a tiny config (4-channel stem, 5 blocks).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from zonos.audio import resample
from zonos.errors import ZonosInputError
from zonos.speaker import (
    LDA_FILE,
    MAX_SECONDS,
    NETWORK_FILE,
    LogMelFeatures,
    ResNetSimAMASP,
    SpeakerCheckpointError,
    SpeakerEmbedding,
    SpeakerNetConfig,
    check_speaker_clip,
    load_speaker_embedding,
)

DATA = Path(__file__).parent / "data"
TINY = SpeakerNetConfig(in_planes=4, num_blocks=(1, 2, 1, 1), attention_dim=8, embed_dim=16, lda_dim=128)


def _tsv(name: str) -> list[tuple[str, str, str]]:
    lines = (DATA / name).read_text().splitlines()[1:]
    return [tuple(line.split("\t")) for line in lines]


def _layout(state_dict) -> list[tuple[str, str, str]]:
    dtypes = {torch.float32: "f32", torch.int64: "i64"}
    return [
        (k, "scalar" if v.dim() == 0 else "x".join(map(str, v.shape)), dtypes[v.dtype]) for k, v in state_dict.items()
    ]


# -- (1) checkpoint layout ---------------------------------------------------------------------------


def test_network_and_lda_match_published_checkpoint_layout():
    with torch.device("meta"):
        network = ResNetSimAMASP()
        lda = torch.nn.Linear(SpeakerNetConfig().embed_dim, SpeakerNetConfig().lda_dim)
    assert _layout(network.state_dict()) == _tsv("speaker_embedding_state_dict.tsv")  # names, order, shapes
    assert _layout(lda.state_dict()) == _tsv("speaker_embedding_lda_state_dict.tsv")
    n_float = sum(v.numel() for v in network.state_dict().values() if v.is_floating_point())
    assert n_float == 99_024_064
    # The front end's window and filterbank are computed, not stored (upstream has no featCal.* keys).
    assert list(LogMelFeatures().state_dict()) == []


# -- (2) log-mel front end -----------------------------------------------------------------------------


def _htk_mel(f):
    return 2595.0 * np.log10(1.0 + f / 700.0)


def _htk_hz(m):
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


def reference_log_mel(x: np.ndarray, sr: int = 16000) -> tuple[np.ndarray, np.ndarray]:
    """torchaudio MelSpectrogram(n_fft=512, win_length=400, hop_length=160, n_mels=80) semantics written
    from its documentation, in float64: frames of the reflect-padded signal, explicit rfft, triangles."""
    n_fft, win, hop, n_mels = 512, 400, 160, 80
    padded = np.pad(x.astype(np.float64), n_fft // 2, mode="reflect")
    n_frames = 1 + (len(padded) - n_fft) // hop
    window = np.zeros(n_fft)
    left = (n_fft - win) // 2
    window[left : left + win] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / win)  # periodic Hann
    frames = padded[np.arange(n_fft)[None, :] + hop * np.arange(n_frames)[:, None]]
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2  # [frames, 257]

    freqs = np.arange(n_fft // 2 + 1) * sr / n_fft
    corners = _htk_hz(np.linspace(_htk_mel(0.0), _htk_mel(sr / 2), n_mels + 2))
    fbank = np.zeros((len(freqs), n_mels))
    for m in range(n_mels):
        lo, centre, hi = corners[m : m + 3]
        for k, f in enumerate(freqs):
            if lo <= f <= centre:
                fbank[k, m] = (f - lo) / (centre - lo)
            elif centre < f <= hi:
                fbank[k, m] = (hi - f) / (hi - centre)
    mel = (power @ fbank).T  # [80, frames]
    logmel = np.log(mel + 1e-6)
    return mel, logmel - logmel.mean(axis=1, keepdims=True)


def test_log_mel_matches_numpy_reference():
    rng = np.random.default_rng(0)
    n = 16000 + 37  # not a multiple of the hop
    # Noise plus a chirp, so bins differ in level by orders of magnitude.
    t = np.arange(n) / 16000
    x = (0.1 * rng.standard_normal(n) + 0.5 * np.sin(2 * np.pi * (200 + 1500 * t) * t)).astype(np.float32)
    front = LogMelFeatures()
    ours_mel = front.mel_power(torch.from_numpy(x)[None])[0].double().numpy()
    ours = front(torch.from_numpy(x)[None])[0].double().numpy()
    ref_mel, ref = reference_log_mel(x)
    assert ours.shape == ref.shape == (80, n // 160 + 1)
    np.testing.assert_allclose(ours_mel, ref_mel, rtol=2e-4, atol=1e-9)
    np.testing.assert_allclose(ours, ref, atol=2e-4)
    for length in (16159, 16160, 16161):
        assert front(torch.zeros(1, length) + 0.1).shape[-1] == length // 160 + 1 == front.num_frames(length)


# -- (3) tiny network: functional reference, files, embed ----------------------------------------------


def random_state(config: SpeakerNetConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded weights with He-scaled convs and non-trivial BatchNorm statistics."""
    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in ResNetSimAMASP(config).state_dict().items()}
    out = {}
    for name, shape in shapes.items():
        if name.endswith("num_batches_tracked"):
            out[name] = torch.tensor(7)
        elif name.endswith("running_var"):
            out[name] = 0.5 + torch.rand(shape, generator=g)
        elif name.endswith(("running_mean", "bias")):
            out[name] = 0.1 * torch.randn(shape, generator=g)
        elif len(shape) == 1:  # BatchNorm scale
            out[name] = 1 + 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = torch.randn(shape, generator=g) * math.sqrt(2 / math.prod(shape[1:]))
    return out


def random_lda(config: SpeakerNetConfig, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "weight": torch.randn(config.lda_dim, config.embed_dim, generator=g) / math.sqrt(config.embed_dim),
        "bias": 0.1 * torch.randn(config.lda_dim, generator=g),
    }


def reference_network(sd: dict[str, torch.Tensor], feats: torch.Tensor, config: SpeakerNetConfig) -> torch.Tensor:
    """The network written functionally from the checkpoint keys and NOTES.md (float64; SimAM via the
    unbiased variance, the pooled deviation as sqrt(sum w (x - mu)^2))."""
    sd = {k: v.double() for k, v in sd.items()}

    def bn(x, p):
        return F.batch_norm(x, sd[f"{p}.running_mean"], sd[f"{p}.running_var"], sd[f"{p}.weight"], sd[f"{p}.bias"])

    x = F.relu(bn(F.conv2d(feats.double()[:, None], sd["front.conv1.weight"], padding=1), "front.bn1"))
    for stage, blocks in enumerate(config.num_blocks):
        for b in range(blocks):
            p = f"front.layer{stage + 1}.{b}"
            stride = 2 if stage > 0 and b == 0 else 1
            h = F.relu(bn(F.conv2d(x, sd[f"{p}.conv1.weight"], stride=stride, padding=1), f"{p}.bn1"))
            h = bn(F.conv2d(h, sd[f"{p}.conv2.weight"], padding=1), f"{p}.bn2")
            mu, var = h.mean(dim=(2, 3), keepdim=True), h.var(dim=(2, 3), keepdim=True, unbiased=True)
            h = h * torch.sigmoid((h - mu) ** 2 / (4 * (var + 1e-4)) + 0.5)
            shortcut = x
            if f"{p}.downsample.0.weight" in sd:
                shortcut = bn(F.conv2d(x, sd[f"{p}.downsample.0.weight"], stride=stride), f"{p}.downsample.1")
            x = F.relu(h + shortcut)
    b, c, hgt, t = x.shape
    x = x.reshape(b, c * hgt, t)
    a = F.relu(F.conv1d(x, sd["pooling.attention.0.weight"], sd["pooling.attention.0.bias"]))
    a = bn(a, "pooling.attention.2")
    w = torch.softmax(F.conv1d(a, sd["pooling.attention.3.weight"], sd["pooling.attention.3.bias"]), dim=2)
    mu = (w * x).sum(2)
    sigma = (w * (x - mu[..., None]) ** 2).sum(2).clamp(min=1e-5).sqrt()
    return F.linear(torch.cat([mu, sigma], 1), sd["bottleneck.weight"], sd["bottleneck.bias"])


def _speech_like(seconds: float, sr: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(seconds * sr)) / sr
    return 0.3 * torch.sin(2 * math.pi * 180 * t) * torch.sin(2 * math.pi * 3 * t) + 0.05 * torch.randn(
        t.shape, generator=g
    )


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("speaker")
    torch.save(random_state(TINY), d / NETWORK_FILE)
    torch.save(random_lda(TINY), d / LDA_FILE)
    return d


@pytest.fixture(scope="module")
def tiny(tiny_files):
    return SpeakerEmbedding.from_local(tiny_files / NETWORK_FILE, tiny_files / LDA_FILE, config=TINY)


def test_tiny_network_matches_functional_reference(tiny):
    wav = _speech_like(1.0, 16000)[None]
    feats = tiny.features(wav)
    with torch.no_grad():
        ours = tiny.network(feats)
    ref = reference_network(random_state(TINY), feats, TINY)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-4, atol=1e-4)
    raw, projected = tiny(wav)
    lda = random_lda(TINY)
    torch.testing.assert_close(
        projected.double(), F.linear(ref, lda["weight"].double(), lda["bias"].double()), rtol=1e-4, atol=1e-4
    )


def test_from_local_round_trip_and_embed_contract(tiny, tiny_files):
    assert not tiny.training and not any(p.requires_grad for p in tiny.parameters())
    assert tiny.dtype == torch.float32 and tiny.device == torch.device("cpu")
    saved = random_state(TINY)
    for k, v in tiny.network.state_dict().items():
        assert torch.equal(v, saved[k]), k

    wav = _speech_like(1.2, 16000)
    emb = tiny.embed(wav, 16000)
    assert emb.shape == (1, 1, 128) and emb.dtype == torch.bfloat16 and torch.isfinite(emb.float()).all()
    assert torch.equal(emb, tiny.embed(wav.clone(), 16000))  # deterministic
    _, projected = tiny(wav[None])
    assert torch.equal(emb, projected[None].bfloat16())  # the LDA output, [1, 1, 128] bf16
    # Channels are averaged: a stereo pair equals its mono mix.
    other = _speech_like(1.2, 16000, seed=1)
    stereo = torch.stack([wav, other])
    assert torch.equal(tiny.embed(stereo, 16000), tiny.embed((wav + other) / 2, 16000))
    # Other rates are resampled to 16 kHz first; numpy input works too.
    wav24 = _speech_like(1.2, 24000)
    assert torch.equal(tiny.embed(wav24, 24000), tiny.embed(resample(wav24, 24000, 16000), 16000))
    assert torch.equal(tiny.embed(wav.numpy(), 16000), emb)

    # A local directory works as from_pretrained's repo.
    again = SpeakerEmbedding.from_pretrained(str(tiny_files), config=TINY)
    assert torch.equal(again.embed(wav, 16000), emb)


def test_strict_load_lists_every_problem(tmp_path):
    sd = random_state(TINY)
    del sd["front.layer1.0.conv1.weight"]
    sd["front.extra.weight"] = torch.zeros(3)
    sd["bottleneck.bias"] = torch.zeros(17)
    lda = random_lda(TINY)
    with pytest.raises(SpeakerCheckpointError) as info:
        SpeakerEmbedding.from_state_dicts(sd, lda, config=TINY)
    msg = str(info.value)
    assert "missing: front.layer1.0.conv1.weight" in msg and "unexpected: front.extra.weight" in msg
    assert "mis-shaped: bottleneck.bias: checkpoint (17,) vs model (16,)" in msg

    # The real sizes against the tiny file: counted, and the list is cut short.
    torch.save(random_state(TINY), tmp_path / "net.pt")
    torch.save(lda, tmp_path / "lda.pt")
    with pytest.raises(SpeakerCheckpointError, match=r"(?s)net\.pt does not fit.*920 missing.*and 70 more mis-shaped"):
        SpeakerEmbedding.from_local(tmp_path / "net.pt", tmp_path / "lda.pt")

    with pytest.raises(SpeakerCheckpointError, match="mis-shaped: weight"):
        SpeakerEmbedding.from_state_dicts(
            random_state(TINY), {"weight": torch.zeros(128, 8), "bias": lda["bias"]}, config=TINY
        )

    # BatchNorm step counters only matter for training: a file without them still loads.
    no_counters = {k: v for k, v in random_state(TINY).items() if not k.endswith("num_batches_tracked")}
    SpeakerEmbedding.from_state_dicts(no_counters, lda, config=TINY)

    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(SpeakerCheckpointError, match="junk.pt"):
        SpeakerEmbedding.from_local(tmp_path / "junk.pt", tmp_path / "lda.pt", config=TINY)
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        SpeakerEmbedding.from_local(tmp_path / "nope.pt", tmp_path / "lda.pt", config=TINY)


# -- (4) input checks ------------------------------------------------------------------------------------


def test_embed_rejects_bad_input(tiny):
    ok = _speech_like(1.0, 16000)
    with pytest.raises(ValueError, match="silent"):
        tiny.embed(torch.zeros(16000), 16000)
    with pytest.raises(ValueError, match="silent"):
        tiny.embed(1e-8 * ok, 16000)
    with pytest.raises(ValueError, match=r"too short.*at least 0\.5 s"):
        tiny.embed(ok[:6400], 16000)
    with pytest.raises(ValueError, match="empty"):
        tiny.embed(torch.zeros(0), 16000)
    with pytest.raises(ValueError, match=r"\[channels, samples\]"):
        tiny.embed(ok[None, None], 16000)
    with pytest.raises(ValueError, match=r"looks like \[samples, channels\]"):
        tiny.embed(torch.stack([ok, ok], dim=1), 16000)
    with pytest.raises(ValueError, match="floating point"):
        tiny.embed((ok * 32767).to(torch.int16), 16000)
    for sr in (0, -16000, 22050.5):
        with pytest.raises(ValueError, match="sample rate"):
            tiny.embed(ok, sr)
    with pytest.raises(ValueError, match="NaN"):
        tiny.embed(torch.where(torch.arange(16000) == 5, float("nan"), ok), 16000)


def _wav_bytes(samples: np.ndarray, sr: int) -> bytes:
    """A 16-bit mono PCM WAV file whose header claims ``sr`` Hz (any value, as an upload may)."""
    import struct

    data = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
    header += struct.pack("<IHHIIHH", 16, 1, 1, sr, sr * 2, 2, 16) + b"data" + struct.pack("<I", len(data))
    return header + data


def test_a_small_wav_claiming_1_hz_is_refused_fast(tiny, tmp_path):
    """A 2 KB upload whose header says 1 Hz used to be resampled to 16000x its length (5 s, 1 GB)."""
    from zonos.audio import load_audio

    path = tmp_path / "tiny.wav"
    path.write_bytes(_wav_bytes(0.3 * np.sin(np.arange(1000) / 3.0), 1))
    assert path.stat().st_size < 2100
    start = time.perf_counter()
    with pytest.raises(ZonosInputError, match="sample rate 1 Hz is outside 8000..768000"):
        tiny.embed(*load_audio(path))
    assert time.perf_counter() - start < 0.1
    with pytest.raises(ZonosInputError, match="sample rate 1 Hz"):  # the check a front end runs before loading
        check_speaker_clip(*load_audio(path))


@pytest.mark.parametrize("sr", [True, 7999, "16000", None, 1e9])
def test_embed_refuses_bad_sample_rates(tiny, sr):
    with pytest.raises(ZonosInputError, match="sample rate"):
        tiny.embed(_speech_like(1.0, 16000), sr)


def test_long_clips_are_trimmed_to_max_seconds(tiny):
    assert MAX_SECONDS == 30.0
    sr = 8000
    clip = _speech_like(MAX_SECONDS + 12, sr, seed=3)
    head = clip[: int(MAX_SECONDS * sr)]
    assert torch.equal(tiny.prepare(clip, sr), tiny.prepare(head, sr))
    assert torch.equal(tiny.embed(clip, sr), tiny.embed(head, sr))
    assert not torch.equal(tiny.embed(clip[-int(MAX_SECONDS * sr) :], sr), tiny.embed(head, sr))


def test_int16_scaled_float_clip_is_rescaled_with_a_warning(tiny):
    clip = _speech_like(1.0, 16000, seed=4)
    with pytest.warns(UserWarning, match="scaled like int16"):
        scaled = tiny.prepare(clip * 32767, 16000)
    torch.testing.assert_close(scaled, tiny.prepare(clip, 16000) * (32767 / 32768))


@pytest.mark.parametrize("window", [256, 16, 7])
def test_inference_path_equals_the_autograd_path(tiny, window, monkeypatch):
    """The in-place, windowed inference forward (bounded memory) computes what the plain modules compute,
    whether a window covers the clip or windows split it (ragged last window included)."""
    from zonos.speaker import network

    monkeypatch.setattr(network, "CONV_WINDOW", window)
    feats = tiny.features(_speech_like(1.5, 16000, seed=5)[None])
    with torch.no_grad():
        fast = tiny.network(feats)
    with torch.enable_grad():
        plain = tiny.network(feats.requires_grad_())
    torch.testing.assert_close(fast, plain.detach(), rtol=1e-5, atol=1e-5)


def test_load_speaker_embedding(tmp_path):
    embedding = torch.randn(1, 1, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    torch.save(embedding, tmp_path / "voice.pt")
    loaded = load_speaker_embedding(tmp_path / "voice.pt")
    assert loaded.shape == (1, 1, 128) and loaded.dtype == torch.bfloat16 and torch.equal(loaded, embedding)
    (tmp_path / "voice.wav").write_bytes(_wav_bytes(np.zeros(16000), 16000))
    with pytest.raises(ZonosInputError, match="voice.wav is an audio file.*--speaker-audio"):
        load_speaker_embedding(tmp_path / "voice.wav")
    for name, value, pattern in [
        ("short.pt", torch.randn(64), "holds a torch.float32 tensor of shape \\(64,\\)"),
        ("ints.pt", torch.zeros(128, dtype=torch.long), "holds a torch.int64 tensor"),
        ("dict.pt", {"embedding": torch.randn(128)}, "holds dict"),
        ("nan.pt", torch.full((128,), float("nan")), "NaN or infinite"),
    ]:
        torch.save(value, tmp_path / name)
        with pytest.raises(ZonosInputError, match=pattern):
            load_speaker_embedding(tmp_path / name)
    (tmp_path / "junk.pt").write_bytes(b"not a pickle at all")
    with pytest.raises(ZonosInputError, match="could not read .*junk.pt"):
        load_speaker_embedding(tmp_path / "junk.pt")
    with pytest.raises(ZonosInputError, match="not found"):
        load_speaker_embedding(tmp_path / "missing.pt")
    with pytest.raises(ZonosInputError, match="device 'gpu' is not a device name"):
        load_speaker_embedding(tmp_path / "missing.pt", device="gpu")


def test_nan_speaker_weights_are_refused(tiny_files, tmp_path):
    state = torch.load(tiny_files / NETWORK_FILE, weights_only=True)
    name = next(k for k, v in state.items() if v.is_floating_point() and v.ndim == 4)
    state[name] = state[name].clone().fill_(float("inf"))
    torch.save(state, tmp_path / NETWORK_FILE)
    with pytest.raises(SpeakerCheckpointError, match=f"NaN or infinite values in 1 tensor.*{name}"):
        SpeakerEmbedding.from_local(tmp_path / NETWORK_FILE, tiny_files / LDA_FILE, config=TINY)


# -- (5) hub ---------------------------------------------------------------------------------------------


def test_offline_hub_without_cache_gives_clear_error(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="huggingface-cli download") as info:
        SpeakerEmbedding.from_pretrained(cache_dir=str(tmp_path / "cache"))
    assert "Zyphra/Zonos-v0.1-speaker-embedding" in str(info.value) and NETWORK_FILE in str(info.value)
