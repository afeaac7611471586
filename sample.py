#!/usr/bin/env python3
"""Text to speech with Zonos: ``zonos-tts speak`` as a script (the same code, the same flags).

Examples:
    python sample.py "Hello from Zonos." --out hello.wav
    python sample.py --stream --out hello.flac "Streamed, and written as it is generated."
    echo "Hallo Welt." | python sample.py - --language de --seed 1 --out - > hallo.wav
    python sample.py --help

Without text it speaks a default sentence into sample.wav.
"""

import sys

from zonos.cli.speak import speak_main

DEFAULT_TEXT = "It would be nice to have time for testing, indeed."


def main(argv: list[str] | None = None) -> int:
    """Run ``zonos-tts speak`` with this script's defaults; returns the exit status."""
    return speak_main(argv, prog="sample.py", default_text=DEFAULT_TEXT, default_out="sample.wav")


if __name__ == "__main__":
    sys.exit(main())
