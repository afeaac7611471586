"""Zonos backbones (hybrid Mamba2 + attention, and pure transformer) in pure PyTorch."""

from zonos.backbone.backbone import Block, InferenceState, ZonosBackbone

__all__ = ["Block", "InferenceState", "ZonosBackbone"]
