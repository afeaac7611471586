"""Golden values for voice cloning's front end, computed with torchaudio, which upstream Zonos calls for it:
``torchaudio.functional.resample`` (a clip to the speaker model's 16 kHz, audio prefixes to the codec's 44.1 kHz)
and ``torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_fft=512, win_length=400, hop_length=160,
n_mels=80)`` followed by ``log(x + 1e-6)`` and the per-bin mean removal. ``zonos.audio.resample`` and
``zonos.speaker.LogMelFeatures`` reimplement both in plain torch; tests/test_speaker_parity.py compares them with
the values written here.

Needs torchaudio (not a dependency of zonos). Run from the repository root:

    python -m benchmarks.make_speaker_goldens            # writes tests/data/speaker_goldens.json (~0.1 MB)

The inputs are not stored: :func:`signal` regenerates them from each case's (samples, rate, seed), with
numpy's legacy ``RandomState`` whose stream numpy keeps fixed across versions.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "speaker_goldens.json"
# (input rate, output rate, input samples): clip rates people record at, to the speaker model's 16 kHz, and
# 16 kHz up to the codec's 44.1 kHz.
RESAMPLE_CASES = ((44100, 16000, 1000), (48000, 16000, 1000), (24000, 16000, 1000), (22050, 16000, 900))
RESAMPLE_CASES += ((11025, 16000, 600), (16000, 44100, 400))
MEL_ARGS = dict(sample_rate=16000, n_fft=512, win_length=400, hop_length=160, n_mels=80)
MEL_SAMPLES = 2400  # 0.15 s: 16 frames
LOG_FLOOR = 1e-6


def signal(samples: int, sample_rate: int, seed: int) -> np.ndarray:
    """A float64 test clip: a voiced tone, a partial at 0.45 x the rate (above 16 kHz's Nyquist when
    downsampling, so the low-pass filter matters), a chirp and white noise."""
    t = np.arange(samples) / sample_rate
    noise = np.random.RandomState(seed).standard_normal(samples)
    chirp = np.sin(2 * np.pi * (100 + 0.25 * sample_rate * t / t[-1]) * t)
    high = np.sin(2 * np.pi * 0.45 * sample_rate * t)
    return 0.4 * np.sin(2 * np.pi * 220 * t) + 0.15 * high + 0.2 * chirp + 0.05 * noise


def encode(array: np.ndarray) -> dict:
    """An array as JSON: shape, dtype and the little-endian bytes in base64."""
    array = np.ascontiguousarray(array)
    data = array.astype(array.dtype.newbyteorder("<")).tobytes()
    return {"shape": list(array.shape), "dtype": array.dtype.name, "data": base64.b64encode(data).decode("ascii")}


def decode(entry: dict) -> np.ndarray:
    """The inverse of :func:`encode`."""
    dtype = np.dtype(entry["dtype"]).newbyteorder("<")
    return np.frombuffer(base64.b64decode(entry["data"]), dtype=dtype).reshape(entry["shape"]).astype(entry["dtype"])


def goldens() -> dict:
    """Everything the parity test compares, computed with torchaudio."""
    import torch
    import torchaudio

    out: dict = {"torch": torch.__version__, "torchaudio": torchaudio.__version__, "resample": [], "mel": {}}
    for orig, new, samples in RESAMPLE_CASES:
        seed = orig + new
        x = torch.from_numpy(signal(samples, orig, seed))
        case = {"orig_sr": orig, "new_sr": new, "samples": samples, "seed": seed}
        case["float64"] = encode(torchaudio.functional.resample(x, orig, new).numpy())
        case["float32"] = encode(torchaudio.functional.resample(x.float(), orig, new).numpy())
        out["resample"].append(case)

    sr = MEL_ARGS["sample_rate"]
    x = torch.from_numpy(signal(MEL_SAMPLES, sr, 1)).float()[None]
    transform = torchaudio.transforms.MelSpectrogram(**MEL_ARGS)  # float32, as upstream runs it
    power = transform(x)[0]
    features = torch.log(power + LOG_FLOOR)
    features = features - features.mean(dim=-1, keepdim=True)
    fbank = transform.mel_scale.fb.numpy()  # [n_fft // 2 + 1, n_mels]
    nonzero = np.flatnonzero(fbank)
    out["mel"] = {
        "args": MEL_ARGS,
        "samples": MEL_SAMPLES,
        "seed": 1,
        "fbank_shape": list(fbank.shape),
        "fbank_index": nonzero.tolist(),
        "fbank_values": encode(fbank.reshape(-1)[nonzero]),
        "power": encode(power.numpy()),
        "features": encode(features.numpy()),
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT, help="where to write the goldens (JSON)")
    args = p.parse_args()
    try:
        import torchaudio  # noqa: F401
    except ImportError:
        raise SystemExit("torchaudio is not installed here: run this where it is (pip install torchaudio)") from None
    data = goldens()
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    cases = ", ".join(f"{c['orig_sr']}->{c['new_sr']}" for c in data["resample"])
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB) with torchaudio {data['torchaudio']}")
    print(f"resample: {cases}; mel: {data['mel']['samples']} samples -> {decode(data['mel']['power']).shape}")


if __name__ == "__main__":
    main()
