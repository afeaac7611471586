"""The bridge between the speech routes and the engine: :class:`SpeechService` checks a request, prepares its
speaker, segments and prefix audio, submits its segments and feeds their audio to a :class:`Job` (from a feeder
thread), which the response side reads and cancels.

Text longer than one segment is split with :func:`zonos.conditioning.segments.split_text` and spoken as one
utterance by :func:`zonos.longform.speak_segments`, whose frame budgets (those of ``zonos-tts speak``) every
segment gets.
"""

from __future__ import annotations

import asyncio
import io
import secrets
import threading
from pathlib import Path

import torch

from zonos.audio import MAX_PREFIX_SECONDS
from zonos.errors import CheckpointError, ZonosInputError
from zonos.serve.encode import available_formats
from zonos.serve.errors import ApiError
from zonos.serve.schemas import DEFAULT_VOICE, OPENAI_VOICES, VOICE_NAME, SpeechSpec
from zonos.serve.settings import ServerSettings

__all__ = ["END", "Job", "SpeechService", "read_clip"]

END = object()  # the last item of a job's queue


class Job:
    """One speech response: its engine handle (or a long text's chunk iterator), a queue the feeder thread fills with
    audio pieces, and cancellation from the response side."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.handle = None
        self.cancelled = False
        self.lock = threading.Lock()

    def put(self, item) -> None:
        """Queue ``item`` (audio, an exception or :data:`END`) from the feeder thread."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def attach(self, handle) -> bool:
        """Make ``handle`` the current one; False (and the handle cancelled) when the job was cancelled."""
        with self.lock:
            self.handle = handle
            if self.cancelled:
                handle.cancel()
                return False
            return True

    def cancel(self) -> None:
        """Cancel the job and its current handle (from any thread; safe to repeat)."""
        with self.lock:
            self.cancelled = True
            if self.handle is not None:
                self.handle.cancel()


class SpeechService:
    """The model, its engine and the work behind the routes."""

    def __init__(self, model, settings: ServerSettings) -> None:
        self.model = model
        self.settings = settings
        # Conditioning, speaker embeddings and codec encodes of the requests run one at a time (each is short, and
        # at once they would share the CPU's threads); the engine's decode runs on its own thread beside them.
        self.condition_lock = threading.Lock()
        self.formats = available_formats()

    @property
    def engine(self):
        """The model's engine."""
        return self.model.engine

    # voices

    def voice_path(self, name: str) -> Path | None:
        """Where voice ``name`` is stored (None: the server stores no voices)."""
        if self.settings.voices_dir is None:
            return None
        return Path(self.settings.voices_dir) / f"{name}.pt"

    def voice_names(self) -> list[str]:
        """The default voice and the stored ones."""
        d = self.settings.voices_dir
        stored = sorted(p.stem for p in Path(d).glob("*.pt")) if d is not None and Path(d).is_dir() else []
        return [DEFAULT_VOICE, *stored]

    def speaker(self, name: str) -> torch.Tensor | None:
        """The embedding of voice ``name`` (None: the default voice)."""
        from zonos.speaker.voices import VoiceFileError, load_voice

        path = self.voice_path(name) if VOICE_NAME.fullmatch(name) else None
        if path is not None and path.is_file():
            try:
                return load_voice(path)
            except VoiceFileError as e:
                message = f"voice {name!r}: its file is unreadable ({e}); store it again"
                raise ApiError(500, message, "bad_voice_file") from None
        if name == DEFAULT_VOICE or name in OPENAI_VOICES:
            return None
        raise ApiError(
            400,
            f"voice {name!r} is unknown; GET /v1/audio/voices lists them, and POST /v1/audio/voices stores a new one",
            "unknown_voice",
            "voice",
        )

    def embed_clip(self, data: bytes, param: str) -> torch.Tensor:
        from zonos.speaker import MAX_SECONDS, MIN_SECONDS

        wav, sr = read_clip(data, param, MAX_SECONDS)  # the embedding trims to MAX_SECONDS anyway

        if wav.shape[-1] < MIN_SECONDS * sr:
            raise ApiError(
                400,
                f"{param}: {wav.shape[-1] / sr:.2f} s is too short; a voice needs {MIN_SECONDS} s of speech",
                "clip_too_short",
                param,
            )
        try:
            with self.condition_lock, torch.inference_mode():
                return self.model.make_speaker_embedding(wav, sr).detach().cpu()
        except CheckpointError as e:  # the speaker model's files, loaded on first use: the server's to provide
            raise ApiError(
                503, f"this server cannot embed voices: its speaker-embedding model is not available ({e}). The "
                "server's operator must put Zyphra/Zonos-v0.1-speaker-embedding into the server's Hugging Face cache "
                "(`hf download Zyphra/Zonos-v0.1-speaker-embedding`, or give the server Hub access) and retry",
                "speaker_model_unavailable", param, error_type="server_error",
            ) from None  # fmt: skip

    def store_voice(self, name: str, data: bytes, filename: str | None) -> dict:
        from zonos.speaker.voices import save_voice

        if self.settings.voices_dir is None:
            raise ApiError(400, "this server stores no voices: start it with a voices directory", "no_voices_dir")
        if not VOICE_NAME.fullmatch(name) or name == DEFAULT_VOICE:
            raise ApiError(
                400,
                f"name {name!r}: use 1-64 letters, digits, '_', '-' or '.', starting with a letter or digit "
                f"(and not {DEFAULT_VOICE!r})",
                "bad_voice_name",
                "name",
            )
        embedding = self.embed_clip(data, "file")
        Path(self.settings.voices_dir).mkdir(parents=True, exist_ok=True)
        save_voice(self.voice_path(name), embedding, clip=filename or "", source="zonos-tts serve")
        return {"name": name, "object": "voice"}

    # speech

    def check(self, spec: SpeechSpec) -> None:
        """Cheap checks, before any model work."""
        if not spec.text.strip():
            raise ApiError(400, "input is empty: give the text to speak", "empty_input", "input")
        if len(spec.text) > self.settings.max_input_chars:
            raise ApiError(
                400,
                f"input is {len(spec.text)} characters; at most {self.settings.max_input_chars} are allowed per "
                "request: split the text",
                "input_too_long",
                "input",
            )
        if not spec.stream and spec.stream_format == "sse":
            raise ApiError(
                400, "stream false answers one whole audio file, which stream_format 'sse' cannot carry: drop one of "
                "them", "invalid_value", "stream",
            )  # fmt: skip
        if spec.response_format not in self.formats:
            raise ApiError(
                400,
                f"response_format {spec.response_format!r} is not available here; choose one of "
                f"{', '.join(self.formats)}",
                "bad_response_format",
                "response_format",
            )

    def max_frames(self, spec: SpeechSpec) -> int:
        """The most frames one segment of ``spec`` may take: its ``max_new_tokens``, within the server's."""
        return min(spec.max_new_tokens or self.settings.max_new_tokens, self.settings.max_new_tokens)

    def prepare(self, spec: SpeechSpec) -> dict:
        """Everything up to the first segment's submit (on a worker thread): speaker, segments, prefix audio."""
        from zonos.conditioning import make_cond_dict
        from zonos.conditioning.segments import split_text

        segments = split_text(spec.text, self.settings.segment_chars)
        # Every segment's conditioning inputs are checked here, before the clips are decoded and before the 200:
        # later segments are conditioned only as the stream goes, where an error can only cut the answer short
        # (the phonemes are cached for the conditioning that follows).
        for text in segments:
            make_cond_dict(text=text, device="cpu", **spec.cond)
        if len(segments) > 1:  # the slots must hold two segments' text with room for audio
            self.longform_budget(spec, segments)
        if spec.speaker_audio:
            speaker = self.embed_clip(spec.speaker_audio, "speaker_audio")
        else:
            speaker = self.speaker(spec.voice)
        codes = None
        if spec.prefix_audio:
            wav, sr = read_clip(spec.prefix_audio, "prefix_audio", MAX_PREFIX_SECONDS)
            ae = self.model.autoencoder
            with self.condition_lock, torch.inference_mode():
                wav = ae.preprocess(wav.mean(0, keepdim=True)[None].to(self.model.device), sr)
                codes = ae.encode(wav)
            if len(segments) > 1:  # the first segment holds the clip's frames beside its text
                self.longform_budget(spec, segments, codes.shape[-1])
        seed = spec.seed if spec.seed is not None else secrets.randbelow(2**63)
        return dict(
            speaker=speaker,
            segments=segments,
            prefix_codes=codes,
            seed=seed,
            generator=torch.Generator().manual_seed(seed),
        )

    def longform_budget(self, spec: SpeechSpec, segments: list[str], prefix_frames: int = 0) -> int:
        """:func:`zonos.longform.longform_budget` of a long text, its errors naming what client and operator can
        change."""
        from zonos.longform import longform_budget

        return longform_budget(
            self.model, segments, spec.cond.get("language", "en-us"), self.max_frames(spec), self.engine.max_seqlen,
            prefix_frames=prefix_frames, fix=f"Send at most {self.settings.segment_chars} characters (one segment) "
            "per request, or ask the server's operator for a larger --max-seqlen or a smaller segment_chars",
        )  # fmt: skip

    def submit_segment(self, spec: SpeechSpec, plan: dict):
        """Condition the text of a one-segment request and submit it to the engine; returns the handle."""
        from zonos.conditioning import make_cond_dict
        from zonos.model import DEFAULT_CHUNK_FRAMES, DEFAULT_FIRST_CHUNK_FRAMES

        model = self.model
        (text,) = plan["segments"]
        with self.condition_lock, torch.inference_mode():
            cond = make_cond_dict(text=text, speaker=plan["speaker"], device=model.device, **spec.cond)
            prefix = model.prepare_conditioning(cond)
        codes = plan["prefix_codes"]
        audio = 0 if codes is None else codes.shape[2]
        room = self.engine.max_seqlen - prefix.shape[1] - audio - 9
        budget = min(self.max_frames(spec), room)
        if budget < 1:
            raise ZonosInputError(
                f"a segment's text takes {prefix.shape[1]} and the prefix audio {audio} of the model's "
                f"{self.engine.max_seqlen} positions, leaving no room for new audio: shorten the prefix audio or the "
                "text"
            )
        return model.submit(
            prefix,
            audio_prefix_codes=codes,
            stream=True,
            max_new_tokens=budget,
            cfg_scale=spec.cfg_scale,
            sampling_params=spec.sampling,
            generator=plan["generator"],
            first_chunk_frames=spec.first_chunk_frames or DEFAULT_FIRST_CHUNK_FRAMES,
            chunk_frames=spec.chunk_frames or DEFAULT_CHUNK_FRAMES,
            logits_processor=self.settings.logits_processor,
        )

    def submit_longform(self, spec: SpeechSpec, plan: dict):
        """Start speaking a long text through :func:`zonos.longform.speak_segments` (the first segment submitted
        now, so a full engine refuses it here; the prefix audio continued by it); returns its chunk iterator."""
        from zonos.longform import speak_segments

        gen = dict(
            max_new_tokens=self.max_frames(spec),  # per segment; speak_segments caps each to what the slots leave
            cfg_scale=spec.cfg_scale,
            sampling_params=spec.sampling,
            generator=plan["generator"],
            progress_bar=False,
            logits_processor=self.settings.logits_processor,
        )
        for key in ("first_chunk_frames", "chunk_frames"):
            if getattr(spec, key):
                gen[key] = getattr(spec, key)
        cond = dict(spec.cond, speaker=plan["speaker"], device=self.model.device)
        with self.condition_lock:
            return speak_segments(
                self.model, plan["segments"], cond=cond, stream=True, audio_prefix_codes=plan["prefix_codes"], **gen
            )

    def feed(self, job: Job, handle) -> None:
        """The feeder thread: the chunks of ``handle`` (a one-segment request's, or a long text's from
        :meth:`submit_longform`) into ``job``'s queue as float32 arrays; an error, then the end marker."""
        try:
            if not job.attach(handle):
                return
            for chunk in handle:
                job.put(chunk.audio[0, 0].float().cpu().numpy())
        except Exception as err:  # noqa: BLE001 - the response side reports it
            job.put(err)
        finally:
            close = getattr(handle, "close", None)  # a long text's iterator: stop before its next segment
            if close is not None:
                close()
            job.put(END)


def read_clip(data: bytes, param: str, max_seconds: float) -> tuple[torch.Tensor, int]:
    """An uploaded clip's first ``max_seconds`` (a small upload can decode to hours of audio); :class:`ApiError`
    400 naming ``param`` when it is unreadable or empty."""
    from zonos.audio import load_audio

    try:
        wav, sr = load_audio(io.BytesIO(data), max_seconds=max_seconds, name=param)
    except ZonosInputError as e:  # unreadable, or a sample rate out of range: load_audio's message says which
        raise ApiError(400, str(e), "bad_audio", param) from None
    if wav.shape[-1] == 0:
        raise ApiError(400, f"{param}: the audio file has no samples", "bad_audio", param)
    return wav, sr
