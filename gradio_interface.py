#!/usr/bin/env python3
"""A streaming web demo for Zonos text-to-speech (Gradio).

Audio plays while it is generated: every :class:`zonos.streaming.AudioChunk` that
``Zonos.generate(..., stream=True)`` hands out goes straight to a streaming ``gr.Audio`` output, and the
time to the first audio is shown next to it.

Example:
    pip install -e '.[demo]'          # also needs espeak-ng and ffmpeg from the system's package manager
    python gradio_interface.py                                   # http://127.0.0.1:7860
    python gradio_interface.py --model ./my-zonos-dir --device cpu --port 8000
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import threading
import time
import wave
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

try:  # optional at import time, so `--help` and the helpers work without the demo extra
    import gradio as gr
except ImportError:  # pragma: no cover - exercised only without the demo extra
    gr = None

from zonos.conditioning import make_cond_dict, normalize_language, supported_language_codes
from zonos.model import DEFAULT_CHUNK_FRAMES, DEFAULT_FIRST_CHUNK_FRAMES, Zonos
from zonos.utils import HelpFormatter

__all__ = [
    "DEFAULT_MODELS",
    "EMOTIONS",
    "ModelLoader",
    "ModelCache",
    "build_demo",
    "synthesize",
    "to_int16",
    "wav_bytes",
    "parse_args",
    "main",
]

DEFAULT_MODELS = ("Zyphra/Zonos-v0.1-hybrid", "Zyphra/Zonos-v0.1-transformer")
DEFAULT_CODEC = "descript/dac_44khz"
# Upstream's demo defaults: (label, default weight) in the emotion conditioner's order.
EMOTIONS: tuple[tuple[str, float], ...] = (
    ("Happiness", 1.0),
    ("Sadness", 0.05),
    ("Disgust", 0.05),
    ("Fear", 0.05),
    ("Surprise", 0.05),
    ("Anger", 0.05),
    ("Other", 0.1),
    ("Neutral", 0.2),
)
# Conditioning keys the UI can switch to their learned unconditional vector (upstream's list and default).
UNCONDITIONAL_CHOICES = ("speaker", "emotion", "vqscore_8", "fmax", "pitch_std", "speaking_rate", "dnsmos_ovrl")
DEFAULT_UNCONDITIONAL = ("emotion",)
DEFAULT_TEXT = "Zonos uses eSpeak for text to phoneme conversion!"
MIN_SPEAKER_SECONDS = 0.5  # the speaker embedding's minimum; several seconds of clean speech work best
SILENT_RMS = 1e-4  # -80 dBFS: nothing to take a voice from
LOCK_TIMEOUT_S = 300.0  # how long a request waits for the previous one to release the model
MAX_SEED = 2**32 - 1

ModelLoader = Callable[[str], Zonos]
"""Returns the loaded model for a name from the model dropdown (a Hub id or a local directory)."""

# One generation at a time per process: the model keeps a single set of decode caches and one streaming
# vocoder. A plain Lock (not an RLock) because Gradio may close a cancelled generator from another thread.
_generation_lock = threading.Lock()
_speaker_cache: dict[tuple, torch.Tensor] = {}  # the last clip's embedding, keyed by model, path, size, mtime


def _require_gradio() -> Any:
    if gr is None:
        raise ImportError("the web demo needs gradio: pip install -e '.[demo]'")
    return gr


def to_int16(audio: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] to 16-bit PCM (clipped, rounded to nearest)."""
    return np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """A mono 16-bit PCM wav file in memory (what Gradio's streaming ``gr.Audio`` takes per chunk)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(np.ascontiguousarray(samples, dtype="<i2").tobytes())
    return buf.getvalue()


def _error(message: str) -> Exception:
    return _require_gradio().Error(message)


def _speaker_embedding(model: Zonos, path: str) -> torch.Tensor:
    """Read and check a voice clip, then embed it (cached for the last clip)."""
    from zonos.audio import load_audio

    try:
        stat = os.stat(path)
    except OSError as e:
        raise _error(f"Could not read the speaker audio ({e}). Upload the clip again.") from e
    key = (id(model), path, stat.st_size, stat.st_mtime_ns)
    if key in _speaker_cache:
        return _speaker_cache[key]
    try:
        wav, sr = load_audio(path)
    except (OSError, ValueError) as e:
        raise _error(f"Could not read the speaker audio: {e}") from e
    seconds = wav.shape[-1] / sr if sr > 0 else 0.0
    if seconds < MIN_SPEAKER_SECONDS:
        raise _error(
            f"The speaker audio is too short ({seconds:.2f} s); voice cloning needs at least "
            f"{MIN_SPEAKER_SECONDS} s, and 5-30 s of clean speech work best."
        )
    if not bool(torch.isfinite(wav).all()):
        raise _error("The speaker audio contains invalid (NaN or infinite) samples; export it again.")
    rms = float(wav.float().pow(2).mean().sqrt())
    if rms < SILENT_RMS:
        raise _error(
            f"The speaker audio is silent (RMS {rms:.1e}); upload a recording of the voice to clone, "
            "or clear the speaker audio to use the default voice."
        )
    try:
        embedding = model.make_speaker_embedding(wav, sr)
    except (OSError, ValueError) as e:  # offline without the speaker model cached, or a clip it rejects
        raise _error(f"Could not compute the speaker embedding: {e}") from e
    _speaker_cache.clear()
    _speaker_cache[key] = embedding
    return embedding


def synthesize(
    model_loader: ModelLoader,
    model_name: str,
    text: str,
    language: str,
    speaker_audio: str | None,
    happiness: float,
    sadness: float,
    disgust: float,
    fear: float,
    surprise: float,
    anger: float,
    other: float,
    neutral: float,
    vq_score: float,
    fmax: float,
    pitch_std: float,
    speaking_rate: float,
    dnsmos_ovrl: float,
    speaker_noised: bool,
    unconditional_keys: Sequence[str] | None,
    cfg_scale: float,
    min_p: float,
    seed: float,
    randomize_seed: bool,
    max_new_tokens: float,
    *,
    first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
    chunk_frames: int = DEFAULT_CHUNK_FRAMES,
) -> Iterator[tuple[Any, str, Any]]:
    """Stream speech for the demo's inputs (in the UI's order; ``model_loader`` is bound by :func:`build_demo`).

    Yields ``(audio, status, seed)`` for the outputs (streaming ``gr.Audio``, status text box, seed box):
    ``audio`` is one chunk as a mono 16-bit wav file in ``bytes`` (or ``gr.update()`` when only the status
    changes), ``status`` reports the time to first audio and, at the end, the real-time factor, and ``seed``
    is the seed used (``gr.update()`` after the first update).

    Closing the generator (Gradio does when the user presses Stop or leaves) closes the model's stream, so
    the model is ready for the next request.

    Raises:
        gradio.Error: empty text, unknown language, an unreadable, too short or silent speaker clip, a
            model that cannot be loaded, or settings the model rejects; the message says what to change.
    """
    gr_ = _require_gradio()
    if not isinstance(text, str) or not text.strip():
        raise _error("The text is empty: type the sentence to speak.")
    try:
        language = normalize_language(language or "")
    except ValueError as e:
        raise _error(f"{e} Pick a code from the Language dropdown.") from e
    try:
        seed = secrets.randbelow(MAX_SEED + 1) if randomize_seed else int(seed)
    except (TypeError, ValueError, OverflowError) as e:
        raise _error(f"The seed must be a whole number, got {seed!r}.") from e
    if not 0 <= seed <= MAX_SEED:
        raise _error(f"The seed must be between 0 and {MAX_SEED}, got {seed}.")
    try:
        max_new_tokens = int(max_new_tokens)
    except (TypeError, ValueError, OverflowError) as e:
        raise _error(f"Max new tokens must be a whole number, got {max_new_tokens!r}.") from e
    if max_new_tokens < 1:
        raise _error(f"Max new tokens must be at least 1 (86 frames are about one second), got {max_new_tokens}.")

    if not _generation_lock.acquire(timeout=LOCK_TIMEOUT_S):
        raise _error("The model is busy with another request; try again in a moment.")
    try:
        try:
            model = model_loader(model_name)
        except (OSError, ValueError, RuntimeError) as e:
            raise _error(f"Could not load the model {model_name!r}: {e}") from e
        t_request = time.perf_counter()
        unconditional_keys = list(unconditional_keys or ())
        use_speaker = speaker_audio and "speaker" not in unconditional_keys
        speaker = _speaker_embedding(model, speaker_audio) if use_speaker else None
        emotion = [happiness, sadness, disgust, fear, surprise, anger, other, neutral]
        try:
            cond = make_cond_dict(
                text=text,
                language=language,
                speaker=speaker,
                emotion=emotion,
                fmax=float(fmax),
                pitch_std=float(pitch_std),
                speaking_rate=float(speaking_rate),
                vqscore_8=[float(vq_score)] * 8,
                dnsmos_ovrl=float(dnsmos_ovrl),
                speaker_noised=bool(speaker_noised),
                unconditional_keys=unconditional_keys,
                device=model.device,
            )
            prefix = model.prepare_conditioning(cond)
            stream = model.generate(
                prefix,
                max_new_tokens=max_new_tokens,
                cfg_scale=float(cfg_scale),
                sampling_params={"min_p": float(min_p)},
                progress_bar=False,
                generator=torch.Generator(device=model.device).manual_seed(seed),
                stream=True,
                first_chunk_frames=first_chunk_frames,
                chunk_frames=chunk_frames,
            )
        except ValueError as e:  # e.g. all-zero emotions, or settings generate rejects
            raise _error(str(e)) from e
        t_start = time.perf_counter()
        sr = model.autoencoder.sampling_rate
        samples, status, seed_out = 0, "", seed
        try:
            for chunk in stream:
                audio = chunk.audio[0, 0].detach().float().cpu().numpy()
                if audio.size == 0:
                    continue
                now = time.perf_counter()
                if samples == 0:
                    status = (
                        f"first audio after {1000 * (now - t_request):.0f} ms "
                        f"({1000 * (t_start - t_request):.0f} ms conditioning + "
                        f"{1000 * (now - t_start):.0f} ms generation) · seed {seed}"
                    )
                samples += audio.size
                yield wav_bytes(to_int16(audio), sr), status, seed_out
                seed_out = gr_.update()
        except ValueError as e:  # checks the decode loop makes when it starts, e.g. the length limit
            raise _error(str(e)) from e
        finally:
            stream.close()  # a cancelled request stops generating here and resets the streaming vocoder
        elapsed = time.perf_counter() - t_start
        seconds = samples / sr
        if samples == 0:
            status = f"no audio: the model ended at once (seed {seed}); try another seed or longer text"
        else:
            status += f" · {seconds:.2f} s of audio in {elapsed:.2f} s ({seconds / max(elapsed, 1e-9):.2f}× real time)"
        yield gr_.update(), status, seed_out
    finally:
        _generation_lock.release()


def build_demo(
    model_loader: ModelLoader,
    model_names: Sequence[str] = DEFAULT_MODELS,
    first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
    chunk_frames: int = DEFAULT_CHUNK_FRAMES,
) -> Any:
    """Build the Gradio Blocks app.

    Args:
        model_loader: called with the model dropdown's value (one of ``model_names``) on every request;
            returns the loaded :class:`Zonos` (cache it: see :class:`ModelCache`).
        model_names: the dropdown's choices (Hub ids or local directories); the first is the default.
        first_chunk_frames, chunk_frames: the streaming schedule passed to ``Zonos.generate``.

    Returns:
        a ``gradio.Blocks``; launch it with ``.queue().launch()``. The generate event's API name is
        ``synthesize``.
    """
    gr_ = _require_gradio()
    if not model_names:
        raise ValueError("model_names is empty: give at least one Hub id or local model directory")

    def run(*inputs: Any) -> Iterator[tuple[Any, str, Any]]:
        yield from synthesize(model_loader, *inputs, first_chunk_frames=first_chunk_frames, chunk_frames=chunk_frames)

    with gr_.Blocks(title="Zonos streaming TTS") as demo:
        gr_.Markdown(
            "# Zonos streaming text-to-speech\n"
            "Audio starts playing while the rest is generated. Upload a few seconds of clean speech to clone "
            "a voice."
        )
        with gr_.Row():
            with gr_.Column():
                model_name = gr_.Dropdown(list(model_names), value=model_names[0], label="Model")
                text = gr_.Textbox(label="Text to synthesize", value=DEFAULT_TEXT, lines=4)
                language = gr_.Dropdown(supported_language_codes, value="en-us", label="Language code")
                speaker_audio = gr_.Audio(
                    label="Speaker audio to clone (optional, 5-30 s of speech)",
                    type="filepath",
                    sources=["upload", "microphone"],
                )
                speaker_noised = gr_.Checkbox(label="Denoise speaker (hybrid only)", value=False)
            with gr_.Column():
                fmax = gr_.Slider(0, 24000, value=22050, step=1, label="Fmax (Hz); 22050 is best for cloning")
                pitch_std = gr_.Slider(0.0, 300.0, value=45.0, step=1, label="Pitch std (20-45 normal, 60-150 lively)")
                speaking_rate = gr_.Slider(5.0, 30.0, value=15.0, step=0.5, label="Speaking rate")
                vq_score = gr_.Slider(0.5, 0.8, value=0.78, step=0.01, label="VQ score (hybrid only)")
                dnsmos = gr_.Slider(1.0, 5.0, value=4.0, step=0.1, label="DNSMOS overall (hybrid only)")
        with gr_.Accordion("Emotion (uncheck 'emotion' under Advanced for the sliders to take effect)", open=False):
            with gr_.Row():
                emotions = [gr_.Slider(0.0, 1.0, value=v, step=0.05, label=name) for name, v in EMOTIONS[:4]]
            with gr_.Row():
                emotions += [gr_.Slider(0.0, 1.0, value=v, step=0.05, label=name) for name, v in EMOTIONS[4:]]
        with gr_.Accordion("Advanced", open=False):
            with gr_.Row():
                cfg_scale = gr_.Slider(1.0, 5.0, value=2.0, step=0.1, label="CFG scale (1 turns guidance off)")
                min_p = gr_.Slider(0.0, 1.0, value=0.1, step=0.01, label="Min p")
                max_new_tokens = gr_.Slider(
                    86, 86 * 30, value=86 * 30, step=1, label="Max new tokens (86 ≈ one second)"
                )
            with gr_.Row():
                seed = gr_.Number(label="Seed", value=420, precision=0)
                randomize_seed = gr_.Checkbox(label="Randomize seed", value=True)
                unconditional_keys = gr_.CheckboxGroup(
                    list(UNCONDITIONAL_CHOICES),
                    value=list(DEFAULT_UNCONDITIONAL),
                    label="Unconditional keys (use the model's learned default instead of the control)",
                )
        with gr_.Row():
            generate = gr_.Button("Generate", variant="primary")
            stop = gr_.Button("Stop")
        audio = gr_.Audio(label="Generated audio (streaming)", streaming=True, autoplay=True, interactive=False)
        status = gr_.Textbox(label="Time to first audio (server side)", interactive=False)

        inputs = [
            model_name,
            text,
            language,
            speaker_audio,
            *emotions,
            vq_score,
            fmax,
            pitch_std,
            speaking_rate,
            dnsmos,
            speaker_noised,
            unconditional_keys,
            cfg_scale,
            min_p,
            seed,
            randomize_seed,
            max_new_tokens,
        ]
        event = generate.click(run, inputs=inputs, outputs=[audio, status, seed], api_name="synthesize")
        stop.click(None, cancels=[event])
    return demo


class ModelCache:
    """A :data:`ModelLoader` that keeps one model in memory: asking for another frees the current one first.

    The DAC codec is loaded once, on first use, and shared by every model. ``warmup`` (default: on CUDA) runs
    :meth:`Zonos.warmup` with the demo's chunk schedule and every prefill piece size after each load, so no
    visitor waits for kernel compilation or graph capture.
    """

    def __init__(
        self,
        codec: str = DEFAULT_CODEC,
        device: str | torch.device | None = None,
        warmup: bool | None = None,
        first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
        chunk_frames: int = DEFAULT_CHUNK_FRAMES,
    ) -> None:
        from zonos.utils import default_device

        self.codec_name = codec
        self.device = torch.device(device) if device else default_device()
        self.warmup = self.device.type == "cuda" if warmup is None else warmup
        self.schedule = {"first_chunk_frames": first_chunk_frames, "chunk_frames": chunk_frames}
        self._codec = None
        self._name: str | None = None
        self._model: Zonos | None = None
        self._lock = threading.Lock()

    def __call__(self, name: str) -> Zonos:
        """The model for ``name`` (a Hub id or a local directory with config.json and model.safetensors)."""
        from zonos.codec import DACAutoencoder

        with self._lock:
            if self._model is not None and self._name == name:
                return self._model
            speaker_model = self._model.spk_clone_model if self._model is not None else None
            self._model, self._name = None, None  # free the previous model before loading the next
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if self._codec is None:
                self._codec = DACAutoencoder.from_pretrained(self.codec_name, device=self.device)
            t0 = time.perf_counter()
            self._model = Zonos.from_pretrained(name, device=self.device, autoencoder=self._codec)
            self._model.spk_clone_model = speaker_model  # the speaker embedding model serves every model
            self._name = name
            print(f"loaded {name} on {self.device} in {time.perf_counter() - t0:.1f} s", flush=True)
            if self.warmup:
                seconds = self._model.warmup(all_prefill_lengths=True, **self.schedule)
                print(f"warmed up {name} in {seconds:.1f} s", flush=True)
            return self._model


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see ``python gradio_interface.py --help``)."""
    p = argparse.ArgumentParser(
        description="Serve a streaming Zonos text-to-speech web demo (Gradio). Audio plays while it is "
        "generated; the page shows the time to first audio.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="ID_OR_DIR",
        help="a model for the dropdown: Hugging Face repo id (Zyphra/Zonos-v0.1-hybrid or "
        "Zyphra/Zonos-v0.1-transformer) or a local directory holding config.json and model.safetensors. "
        "Repeat to offer several; the first is loaded at start-up, the others when picked (one is kept in "
        f"memory). Default: {' and '.join(DEFAULT_MODELS)}",
    )
    p.add_argument(
        "--codec",
        default=DEFAULT_CODEC,
        help="the DAC codec: Hugging Face repo id or a local directory with config.json and model.safetensors",
    )
    p.add_argument("--device", default=None, help="torch device, e.g. cuda, cuda:1 or cpu (default: cuda if available)")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 serves other machines (e.g. in Docker)"
    )
    p.add_argument("--port", type=int, default=7860, help="port to listen on")
    p.add_argument("--share", action="store_true", help="also serve through a public *.gradio.live link")
    p.add_argument(
        "--first-chunk-frames",
        type=int,
        default=DEFAULT_FIRST_CHUNK_FRAMES,
        help="frames in the first audio chunk (after the vocoder's ~10-frame lookahead); 86 frames ≈ 1 s",
    )
    p.add_argument(
        "--chunk-frames",
        type=int,
        default=DEFAULT_CHUNK_FRAMES,
        help="frames in the steady chunks; the chunks after the first double in size until they reach it",
    )
    p.add_argument("--no-preload", action="store_true", help="load the first model on the first request, not at start")
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the warm-up after each model load (on CUDA it compiles kernels and captures graphs up front, "
        "~40 s the first time on a machine, ~7 s once the kernel caches are warm: every prefill length is captured)",
    )
    args = p.parse_args(argv)
    args.model = args.model or list(DEFAULT_MODELS)
    for name in ("first_chunk_frames", "chunk_frames"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, load the first model and serve the demo until interrupted."""
    import shutil

    args = parse_args(argv)
    _require_gradio()
    if shutil.which("ffmpeg") is None:
        print(
            "warning: ffmpeg is not on PATH; Gradio needs it to stream audio to the browser (apt-get install ffmpeg)",
            flush=True,
        )
    loader = ModelCache(
        codec=args.codec,
        device=args.device,
        warmup=False if args.no_warmup else None,
        first_chunk_frames=args.first_chunk_frames,
        chunk_frames=args.chunk_frames,
    )
    if not args.no_preload:
        loader(args.model[0])
    demo = build_demo(loader, args.model, args.first_chunk_frames, args.chunk_frames)
    demo.queue(default_concurrency_limit=1).launch(server_name=args.host, server_port=args.port, share=args.share)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
