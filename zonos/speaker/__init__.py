"""Speaker embedding for voice cloning: ResNet293-SimAM-ASP + LDA, giving the ``[1, 1, 128]`` Zonos embedding.

Typical use::

    from zonos.audio import load_audio
    from zonos.speaker import SpeakerEmbedding

    spk = SpeakerEmbedding.from_pretrained(device="cuda")
    wav, sr = load_audio("voice.wav")
    embedding = spk.embed(wav, sr)  # [1, 1, 128] bfloat16
"""

from zonos.speaker.embedding import (
    DEFAULT_REPO,
    LDA_FILE,
    MAX_SECONDS,
    MIN_SECONDS,
    NETWORK_FILE,
    SpeakerCheckpointError,
    SpeakerEmbedding,
    check_speaker_clip,
    load_speaker_embedding,
    load_state_dict_strict,
)
from zonos.speaker.features import SAMPLE_RATE, LogMelFeatures, mel_filterbank
from zonos.speaker.network import ResNetSimAMASP, SpeakerNetConfig

__all__ = [
    "DEFAULT_REPO",
    "NETWORK_FILE",
    "LDA_FILE",
    "MAX_SECONDS",
    "MIN_SECONDS",
    "SAMPLE_RATE",
    "SpeakerEmbedding",
    "SpeakerCheckpointError",
    "SpeakerNetConfig",
    "ResNetSimAMASP",
    "LogMelFeatures",
    "mel_filterbank",
    "check_speaker_clip",
    "load_speaker_embedding",
    "load_state_dict_strict",
]
