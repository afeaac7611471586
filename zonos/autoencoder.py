"""Upstream's import path for the codec wrapper (``from zonos.autoencoder import DACAutoencoder``)."""

from zonos.codec.autoencoder import DACAutoencoder

__all__ = ["DACAutoencoder"]
