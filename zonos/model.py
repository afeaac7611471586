"""Zonos: loading, conditioning and generation (prefill → step → sample → emit)."""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator

import torch
import torch.nn as nn
from safetensors import safe_open
from tqdm import tqdm

from zonos import ops
from zonos.backbone import InferenceState, ZonosBackbone
from zonos.checkpoint import check_state_dict
from zonos.codebook_pattern import apply_delay_pattern, revert_delay_pattern
from zonos.codec.autoencoder import DACAutoencoder
from zonos.codec.streaming import StreamingDACDecoder
from zonos.conditioning import PrefixConditioner
from zonos.config import ZonosConfig
from zonos.hub import resolve_file
from zonos.sampling import SamplingParams, sample_tokens
from zonos.streaming import AudioChunk, check_chunk_sizes, stream_chunks
from zonos.utils import default_device, default_dtype

N_CODEBOOKS = 9  # the DAC 44.1 kHz codec's residual codebooks
CODEBOOK_SIZE = 1024
UNKNOWN = -1  # a delayed-code slot not generated yet
DEFAULT_CODEC = "descript/dac_44khz"
SYNC_EVERY = 4  # decode steps between checks for the end of generation (see _EndWatch)
# cuBLAS runs the heads' (2, 2048) × (9225, 2048)ᵀ product with a slow GEMV kernel for the odd N (23.8 µs per
# step on the H200, where N = 8512 takes 11.6 µs), so the stacked heads get zero rows up to a multiple of 16.
HEADS_ROW_MULTIPLE = 16
# Streaming schedule (H200, benchmarks/streaming.py, docs/BENCHMARKS.md, session 15): a 1-frame first chunk hands out
# audio ~3 ms sooner than a 2-frame one (48.0 vs 51.0 ms p50, where the decode steps dominate) at the same
# real-time factor (5.32 vs 5.27); chunks then double up to 16 frames, where a streamed frame's vocoder cost is
# 0.027 ms, 1.24-1.31x the one-shot decode's 0.021 (8 frames: 0.045, 2x; session 18). Steady chunks arrive ~35 ms
# apart and play for 186 ms each.
DEFAULT_FIRST_CHUNK_FRAMES = 1
DEFAULT_CHUNK_FRAMES = 16


class Zonos(nn.Module):
    """The Zonos text-to-speech model: prefix conditioner, backbone, 9 code embeddings and 9 heads.

    ``autoencoder`` (the DAC codec) is not part of the state dict; it is loaded on first use from
    ``descript/dac_44khz`` unless one is given.
    """

    def __init__(self, config: ZonosConfig, autoencoder: DACAutoencoder | None = None, max_seqlen: int = 4096):
        super().__init__()
        self.config = config
        d = config.backbone.d_model
        self.eos_token_id = config.eos_token_id
        self.masked_token_id = config.masked_token_id
        self.max_seqlen = max_seqlen
        self.backbone = ZonosBackbone(config.backbone)
        self.prefix_conditioner = PrefixConditioner(config.prefix_conditioner, d)
        self.embeddings = nn.ModuleList([nn.Embedding(CODEBOOK_SIZE + 2, d) for _ in range(N_CODEBOOKS)])
        self.heads = nn.ModuleList([nn.Linear(d, CODEBOOK_SIZE + 1, bias=False) for _ in range(N_CODEBOOKS)])
        # The 9 heads as one (9·1025 + pad, d) matrix and the 9 tables as one (9·1026, d) table, so a step runs
        # one GEMV and one lookup instead of 9 each; every module's weight is a view of its stack (in-place
        # edits stay shared). Outside the state dict; tied again after loads and casts.
        self.register_buffer("heads_weight", torch.empty(0), persistent=False)
        self.register_buffer("embeddings_weight", torch.empty(0), persistent=False)
        self.register_load_state_dict_post_hook(_tie_weights_after_load)
        self.tie_weights()
        # Upstream pads the 1025-row heads by (1025 mod multiple) zero rows after loading and masks the pad to
        # -inf; the pad's width matters because the repetition penalty clamps MASK ids to the last column.
        m = config.pad_vocab_to_multiple_of
        self.logit_width = CODEBOOK_SIZE + 1 + ((CODEBOOK_SIZE + 1) % m if m else 0)
        self._autoencoder = autoencoder
        self._state: InferenceState | None = None
        self._stream_decoder: StreamingDACDecoder | None = None
        self.spk_clone_model = None  # the speaker embedding model, loaded on first use (upstream's name)

    # ----------------------------------------------------------------------------------------- loading

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str,
        revision: str | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        cache_dir: str | None = None,
        **kwargs,
    ) -> Zonos:
        """Load ``config.json`` and ``model.safetensors`` from a Hub repo (e.g. ``Zyphra/Zonos-v0.1-hybrid``)
        or a local directory holding them. Other keyword arguments go to :meth:`from_local`."""
        config_path = resolve_file(repo_id, "config.json", revision, cache_dir)
        model_path = resolve_file(repo_id, "model.safetensors", revision, cache_dir)
        return cls.from_local(config_path, model_path, device=device, dtype=dtype, **kwargs)

    @classmethod
    def from_local(
        cls,
        config_path: str | os.PathLike,
        model_path: str | os.PathLike,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        autoencoder=None,
        max_seqlen: int = 4096,
        backbone: str | None = None,
        fast_ops: bool | None = None,
        cuda_graphs: bool | None = None,
        use_cute_gemv: bool = False,
    ) -> Zonos:
        """Load from a ``config.json`` and a ``model.safetensors``.

        Args:
            device: defaults to CUDA when available, else CPU.
            dtype: defaults to bf16 on accelerators and fp32 on CPU.
            autoencoder: a :class:`zonos.codec.DACAutoencoder`; None loads ``descript/dac_44khz`` on first use.
            max_seqlen: longest prefix + generated sequence the decode caches are allocated for.
            backbone: upstream's backbone choice (``"torch"`` or ``"mamba_ssm"``), accepted for compatibility:
                one implementation here serves both checkpoints, with fast paths chosen per device.
            fast_ops: route the backbone's ops to the Triton fast paths (mamba_ssm + ours; process-wide, CUDA
                tensors only). None: on when the device is CUDA and ``zonos-accel[gpu]`` is installed.
            cuda_graphs: replay the decode step as a CUDA graph captured once and reused across requests.
                None: on when the device is CUDA.
            use_cute_gemv: decode-shaped projections (≤ 8 rows: batch ≤ 4 with CFG) through our CuTeDSL GEMVs
                instead of cuBLAS (needs ``nvidia-cutlass-dsl``; process-wide; prefill stays on cuBLAS).
        """
        if backbone not in (None, "torch", "mamba_ssm"):
            raise ValueError(f"unknown backbone {backbone!r}: upstream's names are 'torch' and 'mamba_ssm'")
        device = torch.device(device) if device is not None else default_device()
        dtype = dtype or default_dtype(device)
        config = ZonosConfig.from_json(config_path)
        with torch.device("meta"):
            model = cls(config, autoencoder=autoencoder, max_seqlen=max_seqlen)
        state = {}
        with safe_open(str(model_path), framework="pt", device="cpu") as f:
            for key in f.keys():
                state[key] = f.get_tensor(key)
        model.load_checkpoint(state, device=device, dtype=dtype)
        model.eval()
        model.use_accelerators(fast_ops=fast_ops, cuda_graphs=cuda_graphs, use_cute_gemv=use_cute_gemv)
        return model

    def use_accelerators(
        self, fast_ops: bool | None = None, cuda_graphs: bool | None = None, use_cute_gemv: bool | None = None
    ) -> None:
        """Switch GPU fast paths on or off (None: on where the device and installed packages allow, with a warning
        on CUDA when the Triton ops' packages are missing; the CuTeDSL GEMV stays off unless asked for). Changing
        them after graphs were captured recaptures.

        Asking for one (True) that the machine cannot run raises an error naming what is missing.
        """
        on_cuda = self.device.type == "cuda"
        for name, wanted in (("fast_ops", fast_ops), ("cuda_graphs", cuda_graphs), ("use_cute_gemv", use_cute_gemv)):
            if wanted and not on_cuda:
                raise ValueError(f"{name}=True needs the model on a CUDA device; it is on {self.device}")
        if fast_ops or (fast_ops is None and on_cuda):
            from zonos_accel.triton import disable_triton_ops, enable_triton_ops

            try:
                enable_triton_ops()
            except ImportError as err:
                disable_triton_ops()
                if fast_ops:
                    raise
                warnings.warn(
                    f"the Triton fast ops are off ({err}), so the decode runs on the torch reference ops, about 3x "
                    "slower on a GPU; install them with `pip install -e '.[gpu]'`, or pass fast_ops=False to silence "
                    "this",
                    stacklevel=2,
                )
        elif fast_ops is False and "zonos_accel.triton" in sys.modules:
            sys.modules["zonos_accel.triton"].disable_triton_ops()
        if use_cute_gemv:
            from zonos_accel.gemv import enable_cute_gemv

            enable_cute_gemv()
        elif use_cute_gemv is False and "zonos_accel.gemv" in sys.modules:
            sys.modules["zonos_accel.gemv"].disable_cute_gemv()
        if cuda_graphs or (cuda_graphs is None and on_cuda):
            from zonos_accel.graph import enable_cuda_graphs

            enable_cuda_graphs(self)
        elif "zonos_accel.graph" in sys.modules:
            sys.modules["zonos_accel.graph"].disable_cuda_graphs(self)

    def load_checkpoint(self, state: dict[str, torch.Tensor], device: torch.device | str, dtype: torch.dtype) -> None:
        """Strictly load a state dict (names and shapes must match the config), casting floats to ``dtype``."""
        check_state_dict(
            self.state_dict(),
            state,
            "model.safetensors",
            "the Zonos model built from config.json",
            "Check that config.json and model.safetensors come from the same model.",
        )
        state = {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) for k, v in state.items()}
        self.load_state_dict(state, strict=True, assign=True)

    @torch.no_grad()
    def tie_weights(self) -> None:
        """Make ``heads_weight`` the 9 heads' weights stacked (zero rows appended to a multiple of 16) and
        ``embeddings_weight`` the 9 embedding tables stacked, each module's weight a view of its stack. Runs
        after load_state_dict and casts (a no-op when already tied, so CUDA graphs that read them stay valid);
        call it after replacing a head's or table's weight tensor."""
        self.heads_weight = _stack(self.heads_weight, self.heads, HEADS_ROW_MULTIPLE)
        self.embeddings_weight = _stack(self.embeddings_weight, self.embeddings, 1)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.tie_weights()  # a cast or move gives each head and table its own tensor again
        return self

    @property
    def device(self) -> torch.device:
        """Where the model's weights are."""
        return self.norm_weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The weights' floating dtype (bf16 on a GPU, fp32 on the CPU by default)."""
        return self.norm_weight.dtype

    @property
    def norm_weight(self) -> torch.Tensor:
        """The backbone's final norm weight (what :attr:`device` and :attr:`dtype` read)."""
        return self.backbone.norm_f.weight

    @property
    def autoencoder(self) -> DACAutoencoder:
        """The DAC codec (``decode(codes)``, ``encode(wav)``, ``preprocess(wav, sr)``, ``sampling_rate``)."""
        if self._autoencoder is None:
            self._autoencoder = DACAutoencoder.from_pretrained(DEFAULT_CODEC, device=self.device)
        return self._autoencoder

    @autoencoder.setter
    def autoencoder(self, value: DACAutoencoder | None) -> None:
        self._autoencoder = value

    # ------------------------------------------------------------------------------------ conditioning

    def make_speaker_embedding(self, wav: torch.Tensor, sr: int) -> torch.Tensor:
        """A (1, 1, 128) bf16 speaker embedding of a voice clip (wav (samples,) or (channels, samples) at ``sr``)
        for ``make_cond_dict(speaker=...)``. Loads ``Zyphra/Zonos-v0.1-speaker-embedding`` on first use."""
        if self.spk_clone_model is None:
            from zonos.speaker import SpeakerEmbedding

            self.spk_clone_model = SpeakerEmbedding.from_pretrained(device=self.device)
        return self.spk_clone_model.embed(wav, sr)

    def prepare_conditioning(self, cond_dict: dict, uncond_dict: dict | None = None) -> torch.Tensor:
        """Conditional prefix stacked over the unconditional one along the batch: (2B, L, d).

        Without ``uncond_dict`` the unconditional branch keeps only the required keys (the text), so every
        other conditioner uses its learned unconditional vector.
        """
        if uncond_dict is None:
            uncond_dict = {k: cond_dict[k] for k in self.prefix_conditioner.required_keys if k in cond_dict}
        prefix = torch.cat([self.prefix_conditioner(cond_dict), self.prefix_conditioner(uncond_dict)])
        self._check_length(prefix.shape[1], 1)
        return prefix

    def _check_length(self, prefix_len: int, new_frames: int) -> int:
        needed = prefix_len + new_frames + N_CODEBOOKS
        if needed > self.max_seqlen:
            raise ValueError(
                f"the prefix is {prefix_len} tokens and {new_frames} new frames need {N_CODEBOOKS} more steps: "
                f"{needed} > max_seqlen {self.max_seqlen}. Split the text into shorter pieces (e.g. sentences), "
                "lower max_new_tokens, or load the model with a larger max_seqlen."
            )
        return needed

    # -------------------------------------------------------------------------------------- the network

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """(b, 9, l) code ids in 0..1025 → (b, l, d): the sum of the 9 codebook embeddings, looked up in the
        stacked tables (ids must be in range, since an id past a table reads the next one)."""
        return ops.embedding_sum(codes, self.embeddings_weight, CODEBOOK_SIZE + 2)

    def apply_heads(self, hidden: torch.Tensor) -> torch.Tensor:
        """(b, d) → float logits (b, 9, 1025) over the codes and EOS (the 9 heads as one matrix product)."""
        logits = ops.linear(hidden, self.heads_weight)[..., : N_CODEBOOKS * (CODEBOOK_SIZE + 1)]
        return logits.unflatten(-1, (N_CODEBOOKS, CODEBOOK_SIZE + 1)).float()

    def _guided_logits(self, last_hidden: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        """Heads, classifier-free guidance, then upstream's padding to ``logit_width`` with -inf columns."""
        logits = self.apply_heads(last_hidden)
        if cfg_scale != 1.0:
            cond, uncond = logits.chunk(2)
            logits = uncond + (cond - uncond) * cfg_scale
        pad = self.logit_width - logits.shape[-1]
        if pad:
            logits = torch.cat([logits, logits.new_full((*logits.shape[:2], pad), float("-inf"))], dim=-1)
        # Only codebook 0 may end the sequence.
        logits[:, 1:, self.eos_token_id] = float("-inf")
        return logits

    def _prefill(
        self, prefix: torch.Tensor, codes: torch.Tensor, state: InferenceState, cfg_scale: float
    ) -> torch.Tensor:
        if cfg_scale != 1.0:
            codes = codes.repeat(2, 1, 1)
        hidden = torch.cat([prefix, self.embed_codes(codes)], dim=1)
        return self._guided_logits(self._backbone_prefill(hidden, state)[:, -1], cfg_scale)

    def _backbone_prefill(self, hidden: torch.Tensor, state: InferenceState) -> torch.Tensor:
        """The backbone over the prefill sequence (b, l, d) → (b, l, d). On CUDA, zonos_accel.graph installs a
        runner on the instance that replays it as CUDA graphs of fixed-size pieces."""
        return self.backbone(hidden, state)

    def _step(self, codes: torch.Tensor, state: InferenceState, cfg_scale: float) -> torch.Tensor:
        hidden = self.embed_codes(codes)
        if cfg_scale != 1.0:
            hidden = hidden.repeat(2, 1, 1)
        return self._guided_logits(self.backbone.step(hidden, state)[:, -1], cfg_scale)

    def _inference_state(self, batch_size: int) -> InferenceState:
        """The decode caches, reused across requests while the batch size and length fit (fixed addresses)."""
        s = self._state
        if (
            s is None
            or s.batch_size != batch_size
            or s.max_seqlen != self.max_seqlen
            or s.position.device != self.device
        ):
            s = self._state = self.backbone.allocate_inference_state(batch_size, self.max_seqlen)
        else:
            s.reset()
        return s

    # --------------------------------------------------------------------------------------- generation

    def _validate(self, prefix: torch.Tensor, audio_prefix_codes, max_new_tokens, cfg_scale, batch_size):
        d = self.config.backbone.d_model
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if not isinstance(prefix, torch.Tensor) or prefix.ndim != 3 or prefix.shape[-1] != d:
            raise ValueError(f"prefix_conditioning must be a (batch, length, {d}) tensor from prepare_conditioning")
        if prefix.device != self.device:
            raise ValueError(
                f"prefix_conditioning is on {prefix.device} but the model is on {self.device}: move it with .to()"
            )
        halves = 2 if cfg_scale != 1.0 else 1
        if prefix.shape[0] not in (halves, halves * batch_size) and not (halves == 1 and prefix.shape[0] == 2):
            allowed = f"{halves} (shared by the batch)"
            if batch_size > 1:
                allowed += f" or {halves * batch_size} (cond rows, then uncond rows)"
            raise ValueError(
                f"prefix_conditioning has batch {prefix.shape[0]}; with cfg_scale={cfg_scale} and "
                f"batch_size={batch_size} it must be {allowed}. Pass what prepare_conditioning returns (one cond "
                "and one uncond row per make_cond_dict)"
            )
        if audio_prefix_codes is not None:
            a = audio_prefix_codes
            if (
                not isinstance(a, torch.Tensor)
                or a.ndim != 3
                or a.shape[1] != N_CODEBOOKS
                or a.shape[0] not in (1, batch_size)
            ):
                raise ValueError(
                    f"audio_prefix_codes must be (1 or batch_size, {N_CODEBOOKS}, frames) codes from autoencoder.encode"
                )
            if a.is_floating_point() or a.numel() and (a.min() < 0 or a.max() >= CODEBOOK_SIZE):
                raise ValueError(f"audio_prefix_codes must be integer codes in 0..{CODEBOOK_SIZE - 1}")

    def _arrange_prefix(self, prefix: torch.Tensor, cfg_scale: float, batch_size: int) -> torch.Tensor:
        """To (2B or B, L, d): cond rows for every batch item, then uncond rows."""
        prefix = prefix.to(self.dtype)
        if cfg_scale == 1.0:
            if prefix.shape[0] == 2 and batch_size != 2:  # a cond ‖ uncond pair: guidance off uses the cond half
                prefix = prefix[:1]
            return prefix.expand(batch_size, -1, -1) if prefix.shape[0] == 1 else prefix
        if prefix.shape[0] == 2:
            cond, uncond = prefix.chunk(2)
            return torch.cat([cond.expand(batch_size, -1, -1), uncond.expand(batch_size, -1, -1)])
        return prefix

    def _decode_loop(
        self,
        prefix: torch.Tensor,
        audio_prefix_codes: torch.Tensor | None,
        max_new_tokens: int,
        cfg_scale: float,
        batch_size: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        progress_bar: bool,
    ) -> Iterator[tuple[torch.Tensor, int]]:
        """The decode loop. Yields ``(delayed_codes, offset)`` each time column ``offset`` has been written;
        columns ≤ offset are final. Stops after EOS has reached the last codebook or at max_new_tokens."""
        device = self.device
        prefix_audio_len = 0 if audio_prefix_codes is None else audio_prefix_codes.shape[2]
        self._check_length(prefix.shape[1] + prefix_audio_len, max_new_tokens)
        state = self._inference_state(prefix.shape[0])

        codes = torch.full((batch_size, N_CODEBOOKS, prefix_audio_len + max_new_tokens), UNKNOWN, device=device)
        if audio_prefix_codes is not None:
            codes[..., :prefix_audio_len] = audio_prefix_codes.to(device)
        delayed = apply_delay_pattern(codes, self.masked_token_id)

        offset = prefix_audio_len + 1
        logits = self._prefill(prefix, delayed[..., :offset], state, cfg_scale)
        tokens = sample_tokens(logits, params, None, generator)[..., 0]
        self._write(delayed, offset, tokens)
        yield delayed, offset

        stopping = torch.zeros(batch_size, dtype=torch.bool, device=device)
        first_offset = offset
        max_steps = delayed.shape[2] - offset
        remaining = torch.full((batch_size,), max_steps, device=device)
        window = params.repetition_penalty_window
        end = _EndWatch(device)
        with tqdm(total=max_steps - 1, desc="Generating", unit="frame", disable=not progress_bar) as progress:
            while offset < delayed.shape[2] - 1:
                offset += 1
                tokens = self._decode_step(
                    delayed[..., offset - 1 : offset],
                    delayed[..., max(offset - window, 0) : offset],
                    remaining,
                    stopping,
                    state,
                    cfg_scale,
                    params,
                    generator,
                )
                self._write(delayed, offset, tokens)
                progress.update()
                yield delayed, offset
                # The extra steps after the end write only EOS/MASK, which the frame extraction drops.
                if end.ended(offset - first_offset, remaining):
                    break

    def _decode_step(
        self,
        last_codes: torch.Tensor,
        recent: torch.Tensor,
        remaining: torch.Tensor,
        stopping: torch.Tensor,
        state: InferenceState,
        cfg_scale: float,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """One decode step as tensor work only (no host reads, so it can be captured in a CUDA graph).

        Embeds the last delayed column (b, 9, 1), runs the backbone step and heads, samples with the
        repetition penalty over ``recent`` columns, and applies the EOS bookkeeping: after EOS in codebook 0,
        each later step writes EOS one codebook further (MASK before it), so all codebooks end together
        9 steps later. Updates ``remaining`` and ``stopping`` (b,) in place; returns tokens (b, 9).
        """
        logits = self._step(last_codes, state, cfg_scale)
        tokens = sample_tokens(logits, params, recent, generator)[..., 0]
        eos = tokens[:, 0] == self.eos_token_id
        remaining.copy_(torch.where(eos, remaining.clamp(max=N_CODEBOOKS), remaining))
        stopping |= eos
        eos_cb = (N_CODEBOOKS - remaining).clamp(max=N_CODEBOOKS - 1)[:, None]
        codebook = torch.arange(N_CODEBOOKS, device=tokens.device)
        tokens = torch.where(stopping[:, None] & (codebook < eos_cb), self.masked_token_id, tokens)
        tokens = torch.where(stopping[:, None] & (codebook == eos_cb), self.eos_token_id, tokens)
        remaining -= 1
        return tokens

    @staticmethod
    def _write(delayed: torch.Tensor, offset: int, tokens: torch.Tensor) -> None:
        """Fill the still-unknown slots of column ``offset`` with sampled tokens (b, 9)."""
        column = delayed[..., offset]
        delayed[..., offset] = torch.where(column == UNKNOWN, tokens, column)

    @torch.inference_mode()
    def _stream(self, steps, callback, first_chunk_frames: int, chunk_frames: int) -> Iterator[AudioChunk]:
        if self._stream_decoder is None or self._stream_decoder.dac is not self.autoencoder.dac:
            self._stream_decoder = StreamingDACDecoder(self.autoencoder)
        yield from stream_chunks(
            _with_callback(steps, callback), self._stream_decoder, self.eos_token_id, first_chunk_frames, chunk_frames
        )

    def _frames(self, delayed: torch.Tensor, offset: int) -> torch.Tensor:
        """Frames complete once column ``offset`` is written, cut before the EOS frame when every row has
        one (upstream's length), with EOS/MASK codes replaced by 0 so the result decodes directly."""
        codes = revert_delay_pattern(delayed)[..., : max(offset - N_CODEBOOKS + 1, 0)]
        eos = codes[:, 0] == self.eos_token_id
        if codes.shape[-1] and bool(eos.any(-1).all()):
            codes = codes[..., : int(eos.int().argmax(-1).max())]
        return codes.masked_fill(codes >= CODEBOOK_SIZE, 0)

    @torch.inference_mode()
    def generate(
        self,
        prefix_conditioning: torch.Tensor,
        audio_prefix_codes: torch.Tensor | None = None,
        max_new_tokens: int = 86 * 30,
        cfg_scale: float = 2.0,
        batch_size: int = 1,
        sampling_params: dict | None = None,
        progress_bar: bool = True,
        disable_torch_compile: bool = True,
        callback: Callable[[torch.Tensor, int, int], bool] | None = None,
        generator: torch.Generator | None = None,
        stream: bool = False,
        first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
        chunk_frames: int = DEFAULT_CHUNK_FRAMES,
    ) -> torch.Tensor | Iterator[AudioChunk]:
        """Generate codes (batch_size, 9, frames) for a prefix from :meth:`prepare_conditioning`, or with
        ``stream=True`` an iterator of :class:`zonos.streaming.AudioChunk` handed out as frames complete.

        Args:
            prefix_conditioning: (2, L, d) cond ‖ uncond prefix (shared by the batch) or (2·batch_size, L, d).
            audio_prefix_codes: (1 or batch_size, 9, T) codes of audio to continue; returned codes include them.
            max_new_tokens: most frames to generate (86 ≈ one second).
            cfg_scale: classifier-free guidance; 1.0 turns it off (only the conditional half runs).
            sampling_params: :class:`zonos.sampling.SamplingParams` fields; default ``{"min_p": 0.1}``.
            progress_bar: show a tqdm bar.
            disable_torch_compile: accepted for upstream compatibility; nothing here compiles.
            callback: called as ``callback(frame, step, max_steps)`` after each step; returning False stops.
            generator: a ``torch.Generator`` on the model's device, for reproducible sampling.
            stream: return an iterator of audio chunks instead of codes. Their codes concatenate to the
                one-shot codes of the same seed, their audio to ``autoencoder.decode`` of those codes.
                Closing the iterator early stops generation; the model is ready for the next request.
            first_chunk_frames: frames in the first chunk, after the vocoder's ~10-frame lookahead.
            chunk_frames: frames in the steady chunks; the chunks after the first double in size until they
                reach it, so that each arrives before the audio handed out so far has played.

        EOS/MASK codes in the result are replaced by 0, as upstream does, so it decodes directly.
        """
        params = SamplingParams.from_dict({"min_p": 0.1} if sampling_params is None else sampling_params)
        self._validate(prefix_conditioning, audio_prefix_codes, max_new_tokens, cfg_scale, batch_size)
        prefix = self._arrange_prefix(prefix_conditioning, cfg_scale, batch_size)
        if stream:
            check_chunk_sizes(first_chunk_frames, chunk_frames)
            steps = self._decode_loop(
                prefix, audio_prefix_codes, max_new_tokens, cfg_scale, batch_size, params, generator, progress_bar
            )
            return self._stream(steps, callback, first_chunk_frames, chunk_frames)
        steps = self._decode_loop(
            prefix, audio_prefix_codes, max_new_tokens, cfg_scale, batch_size, params, generator, progress_bar
        )
        delayed, offset = deque(_with_callback(steps, callback), maxlen=1)[0]  # run the loop, keep the last update
        return self._frames(delayed, offset)

    @torch.inference_mode()
    def warmup(
        self,
        prefix_length: int = 120,
        frames: int = 64,
        cfg_scale: float = 2.0,
        sampling_params: dict | None = None,
        batch_size: int = 1,
        first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
        chunk_frames: int = DEFAULT_CHUNK_FRAMES,
        all_prefill_lengths: bool = False,
        progress_bar: bool = True,
    ) -> float:
        """Pay now, behind a progress bar, what the first request would pay: two short streamed requests on
        random conditioning of ``prefix_length`` tokens compile and autotune the GPU kernels (Triton keeps
        both on disk, so only the first process on a machine waits long: ~40 s on an H200, later ones ~3 s)
        and capture the CUDA graphs of the decode step, of the prefill pieces for that length and of the
        vocoder's pushes, which later requests replay. The graphs are keyed by the request's settings, so pass
        the ones the requests will use. A prefill replays one graph per piece of its length (256s, a multiple
        of 16, the rest), so other prefix lengths capture one or two pieces more on first use;
        ``all_prefill_lengths`` captures all 31 piece sizes now (a server taking prompts of any length).
        ``frames`` (64) covers the default schedule's growing chunks and two steady ones.
        Returns the seconds it took; the model is ready for the next request.
        """
        for name, value in (("prefix_length", prefix_length), ("frames", frames)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"warmup's {name} must be a positive int, got {value!r}")
        start = time.perf_counter()
        d = self.config.backbone.d_model
        rows = 2 if cfg_scale != 1.0 else 1
        generator = torch.Generator(self.device).manual_seed(0)  # leaves the caller's random streams alone
        prefix = torch.randn(rows, prefix_length, d, device=self.device, generator=generator).to(self.dtype)
        with tqdm(
            total=2 * frames, desc="Warming up kernels and graphs", unit="frame", disable=not progress_bar
        ) as bar:
            for _ in range(2):  # the vocoder captures a push's graph the second time its shape occurs
                for chunk in self.generate(
                    prefix,
                    max_new_tokens=frames,
                    cfg_scale=cfg_scale,
                    sampling_params=sampling_params,
                    batch_size=batch_size,
                    progress_bar=False,
                    generator=generator,
                    stream=True,
                    first_chunk_frames=first_chunk_frames,
                    chunk_frames=chunk_frames,
                ):
                    bar.update(chunk.frames[1] - chunk.frames[0])
        prefill = self.__dict__.get("_backbone_prefill")  # zonos_accel.graph's runner, when graphs are on
        if all_prefill_lengths and hasattr(prefill, "prepare"):
            prefill.prepare(rows * batch_size)
        return time.perf_counter() - start


def _with_callback(
    steps: Iterator[tuple[torch.Tensor, int]], callback: Callable[[torch.Tensor, int, int], bool] | None
) -> Iterator[tuple[torch.Tensor, int]]:
    """Pass the decode loop's updates through, calling ``callback(frame, step, max_steps)`` after each
    decode step (not after prefill); a False return ends the loop."""
    max_steps = None
    try:
        for step, (delayed, offset) in enumerate(steps):
            yield delayed, offset
            if max_steps is None:
                max_steps = delayed.shape[2] - offset
            elif callback is not None and not callback(delayed[..., offset : offset + 1], step, max_steps):
                return
    finally:
        steps.close()


class _EndWatch:
    """Whether every sequence has ended, read without draining the GPU's queue.

    Every ``SYNC_EVERY`` steps the device flag "some sequence is still running" is copied to pinned host
    memory behind an event, and read ``SYNC_EVERY`` steps later: by then the GPU has normally passed it, so
    the host waits only if it is further ahead than that, and the GPU always has steps queued (reading the
    flag at once would stall the host until the queue drains, then leave the GPU idle while it refills). The
    end is seen fewer than ``2 * SYNC_EVERY`` steps after it happens. On the CPU the flag is read at once.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.flag = torch.empty((), dtype=torch.bool, pin_memory=self.cuda)
        self.event = torch.cuda.Event() if self.cuda else None
        self.submitted: int | None = None  # the step whose flag is in flight

    def ended(self, step: int, remaining: torch.Tensor) -> bool:
        """Call after each step with the device's ``remaining`` steps per sequence."""
        if self.submitted is not None and step - self.submitted >= SYNC_EVERY:
            self.event.synchronize()
            self.submitted = None
            if not bool(self.flag):
                return True
        if step % SYNC_EVERY:
            return False
        running = (remaining > 0).any()
        if not self.cuda:
            return not bool(running)
        if self.submitted is None:
            self.flag.copy_(running, non_blocking=True)
            self.event.record()
            self.submitted = step
        return False


def _stack(stacked: torch.Tensor, modules: nn.ModuleList, row_multiple: int) -> torch.Tensor:
    """The modules' (rows, d) weights as row blocks of one matrix, zero rows appended to a multiple of
    ``row_multiple``, each module's weight made a view of its block; ``stacked`` itself if it already is."""
    weights = [m.weight for m in modules]
    rows, d = weights[0].shape
    n = rows * len(weights)
    if (
        not stacked.is_meta
        and stacked.dim() == 2
        and stacked.shape[0] >= n
        and all(
            w.dtype == stacked.dtype
            and w.device == stacked.device
            and w.shape == stacked[:rows].shape
            and w.data_ptr() == stacked[k * rows :].data_ptr()
            for k, w in enumerate(weights)
        )
    ):
        return stacked
    stacked = weights[0].new_zeros(-(-n // row_multiple) * row_multiple, d)
    for k, (m, w) in enumerate(zip(modules, weights)):
        stacked[k * rows : (k + 1) * rows].copy_(w)
        m.weight = nn.Parameter(stacked[k * rows : (k + 1) * rows], requires_grad=w.requires_grad)
    return stacked


def _tie_weights_after_load(model: Zonos, incompatible_keys) -> None:
    model.tie_weights()
