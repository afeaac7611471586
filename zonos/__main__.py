"""``python -m zonos``: the ``zonos-tts`` command line."""

from zonos.cli import main

raise SystemExit(main())
