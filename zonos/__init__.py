"""Zonos text-to-speech: a clean-room PyTorch implementation that loads the published checkpoints."""
