"""Voice cloning's front end against torchaudio: ``zonos.audio.resample`` and ``zonos.speaker.LogMelFeatures``
compared with values torchaudio computed (tests/data/speaker_goldens.json, written by
``python -m benchmarks.make_speaker_goldens`` on a machine that has torchaudio; the inputs are regenerated here
from the same recipe)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.make_speaker_goldens import LOG_FLOOR, decode, signal
from zonos.audio import resample
from zonos.speaker import LogMelFeatures, mel_filterbank

GOLDENS = Path(__file__).parent / "data" / "speaker_goldens.json"


@pytest.fixture(scope="module")
def goldens() -> dict:
    if not GOLDENS.is_file():
        pytest.skip(
            f"{GOLDENS.name} is absent: make it where torchaudio is installed with "
            "`python -m benchmarks.make_speaker_goldens` and commit it"
        )
    return json.loads(GOLDENS.read_text())


def resample_cases():
    if not GOLDENS.is_file():
        return [None]  # one case, which the fixture skips
    return json.loads(GOLDENS.read_text())["resample"]


@pytest.mark.parametrize(
    "case", resample_cases(), ids=lambda c: "absent" if c is None else f"{c['orig_sr']}-{c['new_sr']}"
)
def test_resample_matches_torchaudio(goldens, case):
    x = torch.from_numpy(signal(case["samples"], case["orig_sr"], case["seed"]))
    expected64, expected32 = decode(case["float64"]), decode(case["float32"])
    ours64 = resample(x, case["orig_sr"], case["new_sr"]).numpy()
    ours32 = resample(x.float(), case["orig_sr"], case["new_sr"]).numpy()
    assert ours64.shape == expected64.shape == expected32.shape
    assert np.abs(expected64).max() > 0.1  # a real signal, not silence
    # The same windowed-sinc filter: float64 agrees to rounding.
    np.testing.assert_allclose(ours64, expected64, rtol=0, atol=1e-10)
    # In float32, torchaudio builds the filter in float32 (sines of large arguments): its output is up to 1.3e-5 from
    # its float64 one (11025 -> 16000). Ours builds it in float64 and only filters in float32, so it stays within
    # float32 rounding of the float64 answer, and within torchaudio's own float32 error of its float32 output.
    np.testing.assert_allclose(ours32, expected64, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ours32, expected32, rtol=0, atol=1e-6 + np.abs(expected32 - expected64).max())


def test_mel_filterbank_matches_torchaudio(goldens):
    mel = goldens["mel"]
    args = mel["args"]
    expected = np.zeros(int(np.prod(mel["fbank_shape"])), dtype=np.float64)
    expected[mel["fbank_index"]] = decode(mel["fbank_values"])
    expected = expected.reshape(mel["fbank_shape"])
    n_freqs = args["n_fft"] // 2 + 1
    ours = mel_filterbank(n_freqs, 0.0, args["sample_rate"] / 2, args["n_mels"], args["sample_rate"]).numpy()
    assert ours.shape == expected.shape == (n_freqs, args["n_mels"])
    assert (expected > 0).sum(0).min() >= 1  # every filter has weight somewhere
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-5)  # torchaudio builds them in float32


def test_log_mel_features_match_torchaudio(goldens):
    mel = goldens["mel"]
    args = mel["args"]
    x = torch.from_numpy(signal(mel["samples"], args["sample_rate"], mel["seed"])).float()[None]
    features = LogMelFeatures(
        sample_rate=args["sample_rate"],
        n_fft=args["n_fft"],
        win_length=args["win_length"],
        hop_length=args["hop_length"],
        n_mels=args["n_mels"],
    )
    power, expected_power = features.mel_power(x)[0].numpy(), decode(mel["power"])
    assert power.shape == expected_power.shape == (args["n_mels"], mel["samples"] // args["hop_length"] + 1)
    np.testing.assert_allclose(power, expected_power, rtol=1e-4, atol=1e-6 * expected_power.max())
    ours, expected = features(x)[0].numpy(), decode(mel["features"])
    assert np.isfinite(expected).all() and expected.std() > 0.5
    np.testing.assert_allclose(ours, expected, rtol=0, atol=2e-4)
    # The golden features are the golden power's log with each bin's mean removed (a check of the file itself).
    logs = np.log(expected_power.astype(np.float64) + LOG_FLOOR)
    np.testing.assert_allclose(expected, logs - logs.mean(-1, keepdims=True), rtol=0, atol=1e-4)
