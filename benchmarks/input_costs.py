"""What adversarial or oversized inputs cost before they are refused or trimmed (CPU; no model weights needed).

Rows: a tiny wav whose header claims 1 Hz; a FLAC of hours of a constant (a few hundred KB that decode to
gigabytes) read whole and through ``load_audio(max_seconds=30)``; eSpeak on text around ``MAX_TEXT_CHARS``. Peak
memory of the decodes is what tracemalloc sees (numpy reports its buffers to it).

    python3 benchmarks/input_costs.py [--hours 1]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np


def _timed(fn) -> tuple[float, int, str]:
    """(seconds, peak bytes allocated, outcome) of ``fn()``."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        fn()
        outcome = "ok"
    except ValueError as e:  # ZonosInputError included
        outcome = f"refused: {str(e)[:60]}"
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak, outcome


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hours", type=float, default=1.0, help="length of the constant-valued FLAC (8 kHz)")
    args = p.parse_args()
    import soundfile as sf

    from zonos.audio import load_audio
    from zonos.conditioning.phonemes import MAX_TEXT_CHARS, check_text, get_espeak_backend

    rows = []
    with tempfile.TemporaryDirectory() as d:
        low = io.BytesIO()
        sf.write(low, np.full(2000, 0.1, np.float32), 1, format="WAV", subtype="PCM_16")  # 4 KB claiming 1 Hz
        data = low.getvalue()
        rows.append((f"{len(data) / 1e3:.0f} KB wav claiming 1 Hz, load_audio", *_timed(
            lambda: load_audio(io.BytesIO(data), max_seconds=30))))  # fmt: skip
        flac = Path(d) / "constant.flac"
        with sf.SoundFile(flac, "w", 8000, 1, "PCM_16", format="FLAC") as f:
            for _ in range(int(args.hours * 360)):
                f.write(np.full(80_000, 0.1, np.float32))
        size = flac.stat().st_size
        label = f"{size / 1e3:.0f} KB FLAC of {args.hours:g} h"
        rows.append((f"{label}, decoded whole (sf.read)", *_timed(lambda: sf.read(flac, dtype="float32"))))
        rows.append((f"{label}, load_audio(max_seconds=30)", *_timed(lambda: load_audio(flac, max_seconds=30))))
    sentence = "The quick brown fox jumps over the lazy dog. "
    espeak = get_espeak_backend("en-us")  # eSpeak itself, past the check that now refuses long text
    for chars in (MAX_TEXT_CHARS // 4, MAX_TEXT_CHARS, 4 * MAX_TEXT_CHARS):
        text = (sentence * (chars // len(sentence) + 1))[:chars]
        rows.append((f"eSpeak on {chars} characters", *_timed(lambda t=text: espeak.phonemize([t], strip=True))))
        rows.append((f"check_text on {chars} characters", *_timed(lambda t=text: check_text(t))))
    print("| input | seconds | peak MB | outcome |\n|---|---|---|---|")
    for label, seconds, peak, outcome in rows:
        print(f"| {label} | {seconds:.3f} | {peak / 1e6:.1f} | {outcome} |")


if __name__ == "__main__":
    main()
