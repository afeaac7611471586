"""The DAC 44.1 kHz audio codec: audio <-> code frames ``[B, 9, T]`` (512 samples per frame)."""

from zonos.codec.autoencoder import CodecNotAvailableError, DACAutoencoder, validate_codes
from zonos.codec.dac import DAC, CheckpointMismatchError, DACConfig, convert_descript_state_dict
from zonos.codec.streaming import ReceptiveField, StreamingDACDecoder, receptive_field

__all__ = [
    "DAC",
    "DACConfig",
    "DACAutoencoder",
    "StreamingDACDecoder",
    "ReceptiveField",
    "receptive_field",
    "CheckpointMismatchError",
    "CodecNotAvailableError",
    "convert_descript_state_dict",
    "validate_codes",
]
