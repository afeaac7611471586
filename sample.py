#!/usr/bin/env python3
"""Text to a 44.1 kHz wav with Zonos.

Example:
    python sample.py --text "Hello from Zonos." --out hello.wav
    python sample.py --model ./my-zonos-dir --device cpu --seed 1 --text "Hallo Welt" --language de
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``python sample.py --help``); bad values stop here, before any model loads."""
    from zonos.conditioning import normalize_language
    from zonos.model import DEFAULT_CHUNK_FRAMES, DEFAULT_FIRST_CHUNK_FRAMES
    from zonos.utils import HelpFormatter

    p = argparse.ArgumentParser(
        description="Synthesize speech from text with a Zonos checkpoint and write it to a wav file.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--text", default="It would be nice to have time for testing, indeed.", help="the text to speak")
    p.add_argument("--out", default="sample.wav", help="output wav path (44.1 kHz, mono, float)")
    p.add_argument(
        "--model",
        default="Zyphra/Zonos-v0.1-hybrid",
        help="Hugging Face repo id (Zyphra/Zonos-v0.1-hybrid or Zyphra/Zonos-v0.1-transformer) "
        "or a local directory holding config.json and model.safetensors",
    )
    p.add_argument(
        "--codec",
        default="descript/dac_44khz",
        help="the DAC codec: Hugging Face repo id or a local directory with config.json and model.safetensors",
    )
    p.add_argument(
        "--language", default="en-us", help="eSpeak language code (see zonos.conditioning.supported_language_codes)"
    )
    p.add_argument(
        "--speaker-embedding",
        default=None,
        help="optional file holding a 128-value speaker embedding tensor saved with torch.save; "
        "without it the model's learned unconditional speaker is used",
    )
    p.add_argument(
        "--speaker-audio",
        default=None,
        help="optional voice clip (wav/flac/ogg, at least 0.5 s of speech) to clone; its embedding comes from "
        "Zyphra/Zonos-v0.1-speaker-embedding (downloaded on first use)",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="random seed for reproducible sampling (without it each run differs)"
    )
    p.add_argument("--cfg-scale", type=float, default=2.0, help="classifier-free guidance scale; 1.0 disables guidance")
    p.add_argument("--min-p", type=float, default=0.1, help="min-p sampling threshold (0 disables it)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=86 * 30,
        help="most frames to generate (86 frames are about one second); the prefix, the frames and 9 more must fit "
        "the model's 4096 positions",
    )
    p.add_argument("--device", default=None, help="torch device, e.g. cuda, cuda:1 or cpu (default: cuda if available)")
    p.add_argument(
        "--stream",
        action="store_true",
        help="stream: write the wav chunk by chunk as frames complete and report time-to-first-audio",
    )
    p.add_argument(
        "--first-chunk-frames",
        type=int,
        default=None,
        help="with --stream: frames in the first chunk (after the vocoder's ~10-frame lookahead) "
        f"(default: {DEFAULT_FIRST_CHUNK_FRAMES})",
    )
    p.add_argument(
        "--chunk-frames",
        type=int,
        default=None,
        help="with --stream: frames in the steady chunks; the chunks after the first double in size until they "
        f"reach it, so that playback never waits (default: {DEFAULT_CHUNK_FRAMES})",
    )
    p.add_argument(
        "--cute-gemv",
        action="store_true",
        help="run the decode projections through our CuTeDSL GEMV instead of cuBLAS (off by default; needs a CUDA "
        "device and pip install -e '.[gpu]' for nvidia-cutlass-dsl, else it stops with an error saying so)",
    )
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="with --stream on CUDA: skip the warm-up request that compiles kernels and captures graphs before the "
        "timed one (the reported time to first audio then includes them: ~40 s the first time on a machine)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = p.parse_args(argv)

    if not args.text.strip():
        p.error("--text is empty: give the words to speak")
    try:
        args.language = normalize_language(args.language)
    except ValueError as e:
        p.error(f"--language: {e}")
    if args.speaker_embedding and args.speaker_audio:
        p.error("give either --speaker-embedding or --speaker-audio, not both")
    if args.max_new_tokens < 1:
        p.error(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    for name in ("first_chunk_frames", "chunk_frames"):
        value, flag = getattr(args, name), "--" + name.replace("_", "-")
        if value is not None and not args.stream:
            p.error(f"{flag} applies only to streaming: add --stream")
        if value is not None and value < 1:
            p.error(f"{flag} must be at least 1, got {value}")
    try:
        args.device = torch.device(args.device) if args.device else None
    except RuntimeError as e:
        p.error(f"--device: {e}")
    if args.device is not None and args.device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu (or a CUDA build of torch)")
    on_cuda = args.device.type == "cuda" if args.device is not None else torch.cuda.is_available()
    if args.cute_gemv and not on_cuda:
        p.error("--cute-gemv runs CUDA kernels and the model is on the CPU here: drop --cute-gemv, or run on a GPU")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the command line; an input or checkpoint problem found after loading prints ``error: ...`` and returns 2."""
    args = parse_args(argv)
    try:
        return synthesize(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def synthesize(args: argparse.Namespace) -> int:
    """Load the model and codec, generate (one-shot or streamed) and write ``args.out``."""
    from zonos.audio import load_audio, save_audio
    from zonos.codec import DACAutoencoder
    from zonos.conditioning import make_cond_dict
    from zonos.model import Zonos
    from zonos.utils import default_device

    device = args.device or default_device()
    speaker = None
    if args.speaker_embedding:
        speaker = torch.load(args.speaker_embedding, map_location="cpu", weights_only=True)
    t0 = time.perf_counter()
    codec = DACAutoencoder.from_pretrained(args.codec, device=device)
    model = Zonos.from_pretrained(args.model, device=device, autoencoder=codec, use_cute_gemv=args.cute_gemv)
    print(f"loaded {args.model} on {device} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    if args.speaker_audio:
        speaker = model.make_speaker_embedding(*load_audio(args.speaker_audio))
    t_request = time.perf_counter()
    cond = make_cond_dict(text=args.text, language=args.language, speaker=speaker, device=device)
    prefix = model.prepare_conditioning(cond)
    args.conditioning_s = time.perf_counter() - t_request
    generator = None
    if args.seed is not None:
        generator = torch.Generator(device=device).manual_seed(args.seed)
    kwargs = dict(
        max_new_tokens=args.max_new_tokens,
        cfg_scale=args.cfg_scale,
        sampling_params={"min_p": args.min_p},
        progress_bar=not args.no_progress,
        generator=generator,
    )
    sr = model.autoencoder.sampling_rate
    if args.stream and device.type == "cuda" and not args.no_warmup:
        schedule = {k: getattr(args, k) for k in ("first_chunk_frames", "chunk_frames") if getattr(args, k) is not None}
        seconds = model.warmup(
            prefix_length=prefix.shape[1],
            cfg_scale=args.cfg_scale,
            sampling_params=kwargs["sampling_params"],
            progress_bar=not args.no_progress,
            **schedule,
        )
        print(f"warmed up in {seconds:.1f} s", file=sys.stderr)
    t0 = time.perf_counter()
    if args.stream:
        seconds = stream_to_file(model, prefix, args, kwargs, t0)
    else:
        codes = model.generate(prefix, **kwargs)
        wav = model.autoencoder.decode(codes)[0]
        seconds = wav.shape[-1] / sr
        save_audio(args.out, wav.cpu(), sr)
    elapsed = time.perf_counter() - t0
    print(
        f"wrote {args.out}: {seconds:.2f} s of audio in {elapsed:.2f} s (real-time factor {seconds / elapsed:.2f}x)",
        file=sys.stderr,
    )
    return 0


def stream_to_file(model, prefix, args: argparse.Namespace, kwargs: dict, t0: float) -> float:
    """Write chunks to ``args.out`` as they arrive; print time-to-first-audio. Returns seconds of audio."""
    import soundfile as sf

    if args.first_chunk_frames is not None:
        kwargs["first_chunk_frames"] = args.first_chunk_frames
    if args.chunk_frames is not None:
        kwargs["chunk_frames"] = args.chunk_frames
    samples = 0
    with sf.SoundFile(args.out, "w", samplerate=model.autoencoder.sampling_rate, channels=1, subtype="FLOAT") as f:
        for chunk in model.generate(prefix, stream=True, **kwargs):
            audio = chunk.audio[0, 0].cpu().numpy()
            if samples == 0 and audio.size:
                ttfa = time.perf_counter() - t0
                print(
                    f"time to first audio: {1000 * ttfa:.0f} ms after conditioning "
                    f"({1000 * (ttfa + args.conditioning_s):.0f} ms including it)",
                    file=sys.stderr,
                )
            f.write(audio)
            f.flush()
            samples += audio.size
    return samples / model.autoencoder.sampling_rate


if __name__ == "__main__":
    sys.exit(main())
