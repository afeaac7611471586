"""Audio formats of the speech server: encoded incrementally for a stream (:class:`StreamEncoder`: each chunk of
samples in, the bytes it adds out), or at once into one complete file (:func:`encode_file`).

``pcm`` is headerless 16-bit little-endian mono; ``wav`` is the same after a RIFF header; ``flac``, ``mp3`` (128
kbit/s constant rate) and ``opus`` (Ogg Opus) come from libsndfile through ``soundfile``, written into an in-memory
file. libsndfile fills in some header fields when it closes a file (FLAC's total sample count, MP3's Info frame with
the encoder delay and padding). A stream hands out the new bytes after every chunk, so those fields have gone out
before they are known: a streamed wav's RIFF lengths are 0xFFFFFFFF and a streamed flac's sample count 0, both
"unknown", and a streamed mp3's Info frame is empty. Such a stream decodes by reading until the data ends
(``soundfile.read`` of a streamed flac fails, since it sizes its array by the header); its mp3 decodes to every
sample plus the codec's delay and padding (under 4 frames of 1152 samples). :func:`encode_file` closes the file
before handing it out, so its header is complete and an mp3 decodes to its exact length.
Opus encodes at 48 kHz only, so its samples are resampled from 44.1 kHz on the way in by
:class:`StreamingResampler`, whose output equals the one-shot :func:`zonos.audio.resample`.
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch

from zonos.errors import ZonosInputError

SAMPLE_RATE = 44_100
OPUS_RATE = 48_000
# response_format -> (libsndfile container, subtype), for the formats that go through soundfile.
_SNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
# MP3 at a constant 128 kbit/s. A decoder sizes a stream without its Info frame from the first frame's bit rate:
# right at a constant rate, while variable-rate frames decoded to 72% of the samples. soundfile sets bitrate_mode
# only together with compression_level; libsndfile maps the level linearly onto 320..32 kbit/s for a constant rate,
# and LAME takes the nearest standard rate below (0.65 -> 132 -> 128).
_MP3_OPTIONS = {"bitrate_mode": "CONSTANT", "compression_level": 0.65}
MEDIA_TYPES = {
    "pcm": "audio/pcm",
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
}


def available_formats() -> list[str]:
    """The response formats this machine can encode (flac, mp3 and opus need libsndfile support for them)."""
    import soundfile as sf

    out = ["pcm", "wav"]
    for name, (container, subtype) in _SNDFILE.items():
        if container in sf.available_formats() and subtype in sf.available_subtypes(container):
            out.append(name)
    return out


def pcm16_bytes(audio: np.ndarray) -> bytes:
    """float32 samples as little-endian 16-bit PCM, converted (clipped, scaled, rounded) by libsndfile, so the
    samples equal those of a 16-bit WAV file of the same audio."""
    import soundfile as sf

    buffer = io.BytesIO()
    with sf.SoundFile(buffer, "w", SAMPLE_RATE, 1, "PCM_16", endian="LITTLE", format="RAW") as f:
        f.write(np.clip(audio, -1.0, 1.0))
    return buffer.getvalue()


def wav_pcm16_header(frames: int | None = None, sample_rate: int = SAMPLE_RATE) -> bytes:
    """A mono 16-bit RIFF/WAVE header for ``frames`` samples; None sets the lengths to "unknown" (0xFFFFFFFF), for
    a stream."""
    from zonos.audio import wav_header

    return wav_header(sample_rate, "PCM_16", frames)


class _Tap(io.RawIOBase):
    """A seekable in-memory file for libsndfile that remembers how much of it has been handed out."""

    def __init__(self):
        super().__init__()
        self.data = bytearray()
        self.pos = 0
        self.sent = 0

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b) -> int:
        b = bytes(b)
        end = self.pos + len(b)
        if end > len(self.data):
            self.data.extend(b"\0" * (end - len(self.data)))
        self.data[self.pos : end] = b
        self.pos = end
        return len(b)

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n is None or n < 0 else min(len(self.data), self.pos + n)
        out = bytes(self.data[self.pos : end])
        self.pos = end
        return out

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.data)}[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def take(self) -> bytes:
        """The bytes written past what was handed out before."""
        out = bytes(self.data[self.sent :])
        self.sent = len(self.data)
        return out


class StreamingResampler:
    """Resamples a stream chunk by chunk to the samples :func:`zonos.audio.resample` gives for the whole.

    The one-shot resampler computes output in blocks of ``new`` samples (``new / orig`` the reduced rate ratio),
    block k from input samples ``[k·orig - width, (k+1)·orig + width)``, zero outside the signal, with one
    convolution of stride ``orig``. This one keeps the input from the first block not yet computed (less
    ``width`` samples of left context) and runs the same convolution over the blocks whose right context has
    arrived; :meth:`flush` computes the rest over the zero padding the one-shot call uses.
    """

    def __init__(self, orig_sr: int, new_sr: int):
        from zonos.audio import _sinc_bank  # the one-shot resampler's filter bank: the same taps

        gcd = math.gcd(orig_sr, new_sr)
        self.orig, self.new = orig_sr // gcd, new_sr // gcd
        kernel, self.width = _sinc_bank(self.orig, self.new, 6, 0.99)
        self.kernel = kernel.float()
        self.buffer = np.zeros(self.width, dtype=np.float32)  # input from block·orig - width on
        self.block = 0  # the next output block to compute
        self.seen = 0  # input samples received

    def push(self, audio: np.ndarray) -> np.ndarray:
        """Output samples that ``audio`` (float32, the next input samples) completes."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        self.buffer = np.concatenate([self.buffer, audio])
        self.seen += audio.size
        ready = (self.seen - self.width) // self.orig - self.block  # block k needs input to (k+1)·orig + width
        return self._blocks(max(ready, 0))

    def flush(self) -> np.ndarray:
        """The remaining output, to ``ceil(N·new/orig)`` samples in all."""
        total = math.ceil(self.new * self.seen / self.orig)
        n = max(-(-total // self.new) - self.block, 0)
        need = n * self.orig + 2 * self.width
        if self.buffer.size < need:
            self.buffer = np.concatenate([self.buffer, np.zeros(need - self.buffer.size, dtype=np.float32)])
        done = self.block * self.new
        return self._blocks(n)[: max(total - done, 0)]

    def _blocks(self, n: int) -> np.ndarray:
        if n == 0:
            return np.zeros(0, dtype=np.float32)
        window = torch.from_numpy(self.buffer[: n * self.orig + 2 * self.width].copy())
        out = torch.nn.functional.conv1d(window[None, None], self.kernel, stride=self.orig)  # (1, new, n)
        self.block += n
        self.buffer = self.buffer[n * self.orig :]
        return out[0].T.reshape(-1).numpy()


class StreamEncoder:
    """Turns float32 chunks at 44.1 kHz into the bytes of ``fmt`` (one of :func:`available_formats`)."""

    def __init__(self, fmt: str):
        if fmt not in MEDIA_TYPES:
            raise ZonosInputError(f"response_format {fmt!r} is unknown; choose one of {', '.join(available_formats())}")
        self.fmt = fmt
        self.started = False
        self._file = None
        self._tap: _Tap | None = None
        self._resampler = StreamingResampler(SAMPLE_RATE, OPUS_RATE) if fmt == "opus" else None

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.fmt]

    def encode(self, audio: np.ndarray) -> bytes:
        """The bytes that ``audio`` (float32 samples, the next piece of the utterance) adds to the stream."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if self.fmt in ("pcm", "wav"):
            head = b""
            if not self.started and self.fmt == "wav":
                head = wav_pcm16_header()
            self.started = True
            return head + pcm16_bytes(audio)
        self._open()
        if self._resampler is not None:
            audio = self._resampler.push(audio)
        if audio.size:
            self._file.write(np.clip(audio, -1.0, 1.0))
        return self._tap.take()

    def finish(self) -> bytes:
        """The stream's last bytes (the encoder's buffered frames and trailer)."""
        if self.fmt in ("pcm", "wav"):
            return b"" if self.started or self.fmt == "pcm" else wav_pcm16_header()
        self._open()
        if self._resampler is not None:
            tail = self._resampler.flush()
            if tail.size:
                self._file.write(np.clip(tail, -1.0, 1.0))
        self._file.close()
        return self._tap.take()

    def _open(self) -> None:
        if self._file is not None:
            return
        self._tap = _Tap()
        self._file = _sound_file(self.fmt, self._tap)


def _sound_file(fmt: str, file) -> object:
    """A ``soundfile.SoundFile`` writing ``fmt`` (one of flac, mp3, opus) into ``file``."""
    import soundfile as sf

    container, subtype = _SNDFILE[fmt]
    rate = OPUS_RATE if fmt == "opus" else SAMPLE_RATE
    return sf.SoundFile(file, "w", rate, 1, subtype, format=container, **(_MP3_OPTIONS if fmt == "mp3" else {}))


def encode_file(fmt: str, audio: np.ndarray) -> bytes:
    """``audio`` (float32 samples at 44.1 kHz) as one complete file of ``fmt``, its header's lengths filled in;
    the samples are those :class:`StreamEncoder` streams."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if fmt not in MEDIA_TYPES:
        raise ZonosInputError(f"response_format {fmt!r} is unknown; choose one of {', '.join(available_formats())}")
    if fmt == "pcm":
        return pcm16_bytes(audio)
    if fmt == "wav":
        return wav_pcm16_header(audio.size) + pcm16_bytes(audio)
    if fmt == "opus":
        resampler = StreamingResampler(SAMPLE_RATE, OPUS_RATE)
        audio = np.concatenate([resampler.push(audio), resampler.flush()])
    buffer = io.BytesIO()
    with _sound_file(fmt, buffer) as f:
        if audio.size:
            f.write(np.clip(audio, -1.0, 1.0))
    return buffer.getvalue()
