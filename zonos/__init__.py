"""Zonos text-to-speech: a clean-room PyTorch implementation that loads the published checkpoints."""

__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)
