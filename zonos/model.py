"""Zonos: loading, conditioning and generation (prefill → step → sample → emit)."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn
from tqdm import tqdm

from zonos.backbone import ZonosBackbone
from zonos.checkpoint import check_state_dict, load_safetensors
from zonos.codebook_pattern import CODEBOOK_SIZE, N_CODEBOOKS, UNKNOWN  # noqa: F401 - upstream's import path
from zonos.codec.autoencoder import DACAutoencoder
from zonos.conditioning import PrefixConditioner
from zonos.config import ZonosConfig
from zonos.engine import Engine, Request, RequestHandle
from zonos.engine.engine import VOCODER_FRAMES
from zonos.errors import ZonosInputError
from zonos.hub import resolve_file
from zonos.ops.backend import REFERENCE, Backend, UsesOps, use_backend
from zonos.sampling import SamplingParams
from zonos.streaming import DEFAULT_CHUNK_FRAMES, DEFAULT_FIRST_CHUNK_FRAMES, AudioChunk, check_chunk_sizes
from zonos.utils import batch_buckets, default_device, default_dtype, naming_compiles, on_meta

DEFAULT_CODEC = "descript/dac_44khz"
DEFAULT_SLOTS = 4  # slots of the engine that generate() runs on (concurrent generate calls decode together)
# cuBLAS runs the heads' (2, 2048) × (9225, 2048)ᵀ product with a slow GEMV kernel for the odd N (23.8 µs per
# step on the H200, where N = 8512 takes 11.6 µs), so the stacked heads get zero rows up to a multiple of 16.
HEADS_ROW_MULTIPLE = 16


def _check_load_args(device: Any, dtype: Any, max_seqlen: Any, backbone: Any) -> tuple[torch.device, torch.dtype]:
    """``from_local``'s device and dtype (defaults filled in), after checking them, ``max_seqlen`` and
    ``backbone``: an unknown device, a dtype that is not a float, or a string length fails before any file is read."""
    from zonos.validation import check_device, check_dtype, check_int

    if backbone not in (None, "torch", "mamba_ssm"):
        raise ZonosInputError(f"unknown backbone {backbone!r}: upstream's names are 'torch' and 'mamba_ssm'")
    check_int("max_seqlen", max_seqlen, N_CODEBOOKS + 2, hint="prefix + generated tokens the caches hold, e.g. 4096")
    device = check_device("device", device) if device is not None else default_device()
    dtype = check_dtype("dtype", dtype) if dtype is not None else default_dtype(device)
    return device, dtype


class Zonos(UsesOps, nn.Module):
    """The Zonos text-to-speech model: prefix conditioner, backbone, 9 code embeddings and 9 heads.

    ``autoencoder`` (the DAC codec) is not part of the state dict; it is loaded on first use from
    ``descript/dac_44khz`` unless one is given. ``backend`` is the set of op implementations the model (and
    its codec) run (:meth:`use_accelerators` chooses it); ``engine`` runs every generation.
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
        self.backend: Backend = REFERENCE
        self._graphs = None  # a zonos_accel.graphs.GraphCache when CUDA graphs are on
        self._engine: Engine | None = None
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
        _check_load_args(device, dtype, kwargs.get("max_seqlen", 4096), kwargs.get("backbone"))  # before a download
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
        use_cute_scan: bool | None = None,
        fused_sampling: bool | None = None,
        fused_blocks: bool = False,
    ) -> Zonos:
        """Load from a ``config.json`` and a ``model.safetensors``.

        Args:
            device: defaults to CUDA when available, else CPU.
            dtype: defaults to bf16 on accelerators and fp32 on CPU.
            autoencoder: a :class:`zonos.codec.DACAutoencoder`; None loads ``descript/dac_44khz`` on first use.
            max_seqlen: longest prefix + generated sequence the decode caches are allocated for.
            backbone: upstream's backbone choice (``"torch"`` or ``"mamba_ssm"``), accepted for compatibility:
                one implementation here serves both checkpoints, with fast paths chosen per device.
            fast_ops: run the model's ops on the Triton fast paths (CUDA tensors only). None: on when the device
                is CUDA and ``zonos-accel[gpu]`` is installed.
            cuda_graphs: replay the decode step, the prefill pieces and the vocoder's pushes as CUDA graphs
                captured once and reused across requests. None: on when the device is CUDA.
            use_cute_gemv: decode-shaped projections (≤ 8 rows: batch ≤ 4 with CFG) through our CuTeDSL GEMVs
                instead of cuBLAS (needs ``nvidia-cutlass-dsl``; prefill stays on cuBLAS).
            use_cute_scan: the prefill's Mamba2 SSD scan through our CuTeDSL kernel, one launch per layer and
                prefill piece (needs ``nvidia-cutlass-dsl``). None: on with the fast ops where it can run; without it
                the fast ops run our Triton scan.
            fused_sampling: the decode step's sampling and EOS bookkeeping as two Triton launches (see
                :meth:`use_accelerators`). None: with the fast ops.
            fused_blocks: every block's decode step through fused Triton GEMVs (see :meth:`use_accelerators`; off
                by default until it is timed).
        """
        device, dtype = _check_load_args(device, dtype, max_seqlen, backbone)
        config = ZonosConfig.from_json(config_path)
        with on_meta():
            model = cls(config, autoencoder=autoencoder, max_seqlen=max_seqlen)
        # Straight onto the device, where the finiteness check over 1.65 G elements takes milliseconds (seconds on
        # the CPU). A truncated or corrupt file: a CheckpointError naming it.
        state = load_safetensors(model_path, device=device)
        model.load_checkpoint(state, device=device, dtype=dtype, source=os.fspath(model_path))
        model.eval()
        model.use_accelerators(
            fast_ops=fast_ops,
            cuda_graphs=cuda_graphs,
            use_cute_gemv=use_cute_gemv,
            use_cute_scan=use_cute_scan,
            fused_sampling=fused_sampling,
            fused_blocks=fused_blocks,
        )
        return model

    def use_accelerators(
        self,
        fast_ops: bool | None = None,
        cuda_graphs: bool | None = None,
        use_cute_gemv: bool | None = None,
        use_cute_scan: bool | None = None,
        fused_sampling: bool | None = None,
        fused_blocks: bool = False,
    ) -> None:
        """Choose this model's op backend and graph capture (None: on where the device and installed packages
        allow, with a warning on CUDA when the Triton ops' packages are missing; the CuTeDSL GEMV stays off unless
        asked for, the CuTeDSL scan is on with the fast ops where nvidia-cutlass-dsl is installed).
        ``fused_sampling``: the decode step's per-row sampling as one Triton launch instead of 66-79 torch
        kernels, and its EOS bookkeeping as one more instead of 30 (one of the fast ops, so None follows them: on an
        H200 the step takes 1.913 ms against 2.071 without it). ``fused_blocks``: every block's decode step
        through fused Triton GEMVs, for decodes of up to 16 rows (batch × CFG; larger ones run op by op): a Mamba2
        block in three kernels (add + LayerNorm and the conv step inside in_proj, the state update, the gated norm
        inside out_proj) instead of six to eight, and an attention block's norms inside its qkv projection and its
        fc1 (with the MLP's activation). One of the fast ops; off by default until it is timed against the op-by-op
        step; the projections it fuses do not run the CuTeDSL GEMV.
        Takes effect at the next decode step (it waits for the running one); captured graphs are keyed by the
        backend, so the next step captures the new backend's. Other models in the process are unaffected.

        Asking for one (True) that the machine cannot run raises an error naming what is missing.
        """
        on_cuda = self.device.type == "cuda"
        flags = (("fast_ops", fast_ops), ("cuda_graphs", cuda_graphs), ("use_cute_gemv", use_cute_gemv),
                 ("use_cute_scan", use_cute_scan), ("fused_sampling", fused_sampling),
                 ("fused_blocks", fused_blocks))  # fmt: skip
        for name, wanted in flags:
            if wanted and not on_cuda:
                raise ZonosInputError(
                    f"{name}=True needs the model on a CUDA device; it is on {self.device}: load it with device='cuda' "
                    f"or leave {name} off"
                )
        for name, wanted in (("fused_sampling", fused_sampling), ("fused_blocks", fused_blocks)):
            if wanted and fast_ops is False:
                raise ZonosInputError(f"{name}=True is one of the fast ops: leave fast_ops on (True or None)")
        if use_cute_scan is not False and self.config.backbone.is_hybrid:
            from zonos_accel.ssd import cute_scan_available, cute_scan_fits

            mamba = self.config.backbone.mamba2()
            fits = cute_scan_fits(mamba["headdim"], mamba["d_state"])
            if use_cute_scan and not fits:
                raise ZonosInputError(
                    "use_cute_scan=True: the CuTeDSL scan takes Mamba2 head dims up to 64 (multiples of 16) and "
                    f"states of 64 or 128, and this model has {mamba['headdim']} and {mamba['d_state']}: leave it off"
                )
            if use_cute_scan is None:
                use_cute_scan = on_cuda and fast_ops is not False and fits and cute_scan_available()
        backend = REFERENCE
        if fast_ops or fused_sampling or fused_blocks or (fast_ops is None and on_cuda):
            import zonos_accel.triton as fast

            try:
                names = fast.DEFAULT_OPS + (fast.FUSED_SAMPLING_OPS if fused_sampling is not False else ())
                names += fast.FUSED_BLOCK_OPS if fused_blocks else ()
                if use_cute_scan:  # the CuTeDSL scan replaces ours
                    names = tuple(name for name in names if name != "ssd_scan")
                backend = fast.triton_backend(backend, names)
            except ImportError as err:
                if fast_ops or fused_sampling or fused_blocks:
                    raise
                warnings.warn(
                    f"the Triton fast ops are off ({err}), so the decode runs on the torch reference ops, about 3x "
                    "slower on a GPU; install them with `pip install -e '.[gpu]'`, or pass fast_ops=False to silence "
                    "this",
                    stacklevel=2,
                )
        if use_cute_gemv:
            from zonos_accel.gemv import cute_gemv_backend

            backend = cute_gemv_backend(backend)
        if use_cute_scan:
            from zonos_accel.ssd import cute_scan_backend

            backend = cute_scan_backend(backend)
        graphs = None
        if cuda_graphs or (cuda_graphs is None and on_cuda):
            from zonos_accel.graphs import GraphCache

            graphs = GraphCache(self.device)
        self.set_backend(backend, graphs)

    def set_backend(self, backend: Backend, graphs=...) -> None:
        """Run ``backend``'s ops from the next decode step on (the model, its codec and its engine), and with
        ``graphs`` given, use that CUDA-graph cache (None: eager). :meth:`use_accelerators` builds both."""
        engine = self._engine
        with engine.idle() if engine is not None else contextlib.nullcontext():
            self.backend = backend
            use_backend(self, backend)
            if self._autoencoder is not None:
                use_backend(self._autoencoder.dac, backend)
            if graphs is not ...:
                self._graphs = graphs
            if engine is not None:
                engine.use_graphs(self._graphs)

    @property
    def engine(self) -> Engine:
        """The engine ``generate`` runs on (created with :data:`DEFAULT_SLOTS` slots on first use; see
        :meth:`start_engine`)."""
        if self._engine is None:
            self.start_engine()
        return self._engine

    def start_engine(
        self,
        slots: int = DEFAULT_SLOTS,
        max_seqlen: int | None = None,
        queue_size: int = 256,
        vocoder_streams: int = 4,
        vocoder_batching: bool = True,
        vocoder_frames: int = VOCODER_FRAMES,
    ) -> Engine:
        """(Re)create the engine with ``slots`` decode slots of up to ``max_seqlen`` tokens (default: the
        model's) and room for ``queue_size`` waiting requests; memory for them is allocated (and checked) now. A
        previous engine is shut down (its requests are cancelled). ``vocoder_streams``: CUDA streams the
        streaming vocoders spread over; ``vocoder_batching``: decode the frames of concurrent streams together
        (see :class:`~zonos.engine.Engine`)."""
        # before the old one stops
        Engine.check_args(slots, max_seqlen, queue_size, vocoder_streams, vocoder_batching, vocoder_frames)
        old, self._engine = self._engine, None
        if old is not None:
            old.shutdown()
            del old
            gc.collect()  # its slots' memory must be free before the new engine checks what fits
        self._engine = Engine(
            self,
            slots,
            max_seqlen or self.max_seqlen,
            queue_size,
            graphs=self._graphs,
            vocoder_streams=vocoder_streams,
            vocoder_batching=vocoder_batching,
            vocoder_frames=vocoder_frames,
        )
        return self._engine

    def load_checkpoint(
        self,
        state: dict[str, torch.Tensor],
        device: torch.device | str,
        dtype: torch.dtype,
        source: str = "model.safetensors",
    ) -> None:
        """Strictly load a state dict (names and shapes must match the config, every float finite), casting floats
        to ``dtype``; ``source`` names the checkpoint in the error."""
        check_state_dict(
            self.state_dict(),
            state,
            source,
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
            use_backend(self._autoencoder.dac, self.backend)
        return self._autoencoder

    @autoencoder.setter
    def autoencoder(self, value: DACAutoencoder | None) -> None:
        self._autoencoder = value
        if value is not None:
            use_backend(value.dac, self.backend)

    # ------------------------------------------------------------------------------------ conditioning

    def make_speaker_embedding(self, wav: torch.Tensor, sr: int) -> torch.Tensor:
        """A (1, 1, 128) bf16 speaker embedding of a voice clip (wav (samples,) or (channels, samples) at ``sr``)
        for ``make_cond_dict(speaker=...)``. Loads ``Zyphra/Zonos-v0.1-speaker-embedding`` on first use, after the
        clip has been checked (see :func:`zonos.speaker.check_speaker_clip`)."""
        from zonos.speaker import check_speaker_clip

        wav, sr = check_speaker_clip(wav, sr)
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
        cond, uncond = self.prefix_conditioner(cond_dict), self.prefix_conditioner(uncond_dict)
        if cond.shape[1] != uncond.shape[1]:
            raise ZonosInputError(
                f"the cond prefix is {cond.shape[1]} tokens and the uncond one {uncond.shape[1]}: give uncond_dict "
                "the same text (and the same set of keys' lengths) as cond_dict, or leave it None"
            )
        prefix = torch.cat([cond, uncond])
        self._check_length(prefix.shape[1], 1)
        return prefix

    def _check_length(self, prefix_len: int, new_frames: int) -> int:
        needed = prefix_len + new_frames + N_CODEBOOKS
        if needed > self.max_seqlen:
            raise ZonosInputError(
                f"the prefix is {prefix_len} tokens and {new_frames} new frames need {N_CODEBOOKS} more steps: "
                f"{needed} > max_seqlen {self.max_seqlen}. Split the text into shorter pieces (e.g. sentences), "
                "lower max_new_tokens, or load the model with a larger max_seqlen."
            )
        return needed

    # -------------------------------------------------------------------------------------- the network

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """(b, 9, l) code ids in 0..1025 → (b, l, d): the sum of the 9 codebook embeddings, looked up in the
        stacked tables (ids must be in range, since an id past a table reads the next one)."""
        return self.ops.embedding_sum(codes, self.embeddings_weight, CODEBOOK_SIZE + 2)

    def apply_heads(self, hidden: torch.Tensor) -> torch.Tensor:
        """(b, d) → float logits (b, 9, 1025) over the codes and EOS (the 9 heads as one matrix product)."""
        logits = self.ops.linear(hidden, self.heads_weight)[..., : N_CODEBOOKS * (CODEBOOK_SIZE + 1)]
        return logits.unflatten(-1, (N_CODEBOOKS, CODEBOOK_SIZE + 1)).float()

    def guided_logits(self, hidden: torch.Tensor, cfg_scale: torch.Tensor) -> torch.Tensor:
        """Heads, classifier-free guidance and upstream's padding: hidden (2n, d) with each sequence's cond row
        followed by its uncond row, guidance scales (n,) → float logits (n, 9, ``logit_width``). A scale of 1.0
        takes the cond logits as they are. Pad columns are -inf, and only codebook 0 may end the sequence."""
        logits = self.apply_heads(hidden)
        cond, uncond = logits[0::2], logits[1::2]
        scale = cfg_scale[:, None, None]
        logits = torch.where(scale == 1.0, cond, uncond + (cond - uncond) * scale)
        pad = self.logit_width - logits.shape[-1]
        if pad:
            logits = torch.cat([logits, logits.new_full((*logits.shape[:2], pad), float("-inf"))], dim=-1)
        logits[:, 1:, self.eos_token_id] = float("-inf")
        return logits

    # --------------------------------------------------------------------------------------- generation

    def _request(
        self,
        prefix: torch.Tensor,
        audio_prefix_codes: torch.Tensor | None,
        max_new_tokens: int,
        cfg_scale: float,
        batch_size: int,
        sampling_params: dict | None,
        generator: torch.Generator | None,
        **settings,
    ) -> Request:
        """A validated engine :class:`Request` for ``generate``'s arguments (no GPU work yet)."""
        from zonos.validation import check_generate_args

        params = SamplingParams.from_dict({"min_p": 0.1} if sampling_params is None else sampling_params)
        for name in ("callback", "logits_processor"):
            if settings.get(name) is not None and not callable(settings[name]):
                raise ZonosInputError(f"{name} must be a function (or None), got {type(settings[name]).__name__}")
        max_new_tokens, cfg_scale, batch_size = check_generate_args(
            prefix,
            audio_prefix_codes,
            max_new_tokens,
            cfg_scale,
            batch_size,
            generator,
            device=self.device,
            d_model=self.config.backbone.d_model,
        )
        if cfg_scale == 1.0 and prefix.shape[0] in (2, 2 * batch_size):
            # prepare_conditioning's cond ‖ uncond layout; guidance off uses the cond rows alone. Passed on whole,
            # a (2, L, d) prefix of batch 2 would read as one cond row per sequence, the second the uncond one.
            prefix = prefix[: prefix.shape[0] // 2]
        # (The engine checks the length against its slots' max_seqlen when the request is submitted.)
        # One seed per sequence, drawn from the caller's generator (or torch's default one): the same generator
        # state gives the same codes, whatever else the engine runs.
        device = generator.device if generator is not None else torch.device("cpu")
        seeds = torch.randint(0, 2**62, (batch_size,), generator=generator, device=device).tolist()
        return Request(
            prefix=prefix,
            audio_prefix_codes=audio_prefix_codes,
            max_new_tokens=max_new_tokens,
            cfg_scale=float(cfg_scale),
            batch_size=batch_size,
            sampling=params,
            seeds=seeds,
            **settings,
        )

    def submit(
        self,
        prefix_conditioning: torch.Tensor,
        audio_prefix_codes: torch.Tensor | None = None,
        max_new_tokens: int = 86 * 30,
        cfg_scale: float = 2.0,
        batch_size: int = 1,
        sampling_params: dict | None = None,
        progress_bar: bool = False,
        disable_torch_compile: bool = True,
        callback: Callable[[torch.Tensor, int, int], bool] | None = None,
        generator: torch.Generator | None = None,
        stream: bool = False,
        first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
        chunk_frames: int = DEFAULT_CHUNK_FRAMES,
        logits_processor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        **request_options,
    ) -> RequestHandle:
        """:meth:`generate`'s request, returned at once as the engine's :class:`~zonos.engine.RequestHandle`
        (thread-safe; for servers): iterate it for a stream's chunks or call ``result()`` for the codes.
        ``request_options`` are further :class:`~zonos.engine.Request` fields (``decoder``, ``emit_prefix``,
        ``flush``: see :mod:`zonos.longform`)."""
        if stream:
            check_chunk_sizes(first_chunk_frames, chunk_frames)
        request = self._request(
            prefix_conditioning,
            audio_prefix_codes,
            max_new_tokens,
            cfg_scale,
            batch_size,
            sampling_params,
            generator,
            stream=stream,
            first_chunk_frames=first_chunk_frames,
            chunk_frames=chunk_frames,
            callback=callback,
            logits_processor=logits_processor,
            **request_options,
        )
        if progress_bar:
            request.progress = tqdm(total=request.max_new_tokens + N_CODEBOOKS - 2, desc="Generating", unit="frame")
        return self._engine_for(request).submit(request)

    def _engine_for(self, request: Request) -> Engine:
        """The engine, grown to ``request.batch_size`` slots when it has fewer and nothing runs on it (upstream's
        ``generate(batch_size=B)`` works for any B); a busy engine keeps its size and the request is refused."""
        engine = self.engine
        if request.batch_size > engine.slots.count and not engine.busy:
            engine = self.start_engine(
                slots=request.batch_size,
                max_seqlen=engine.max_seqlen,
                queue_size=engine.queue_size,
                vocoder_streams=engine.vocoder_streams,
                vocoder_batching=engine.vocoder_batching,
                vocoder_frames=engine.vocoder_frames,
            )
        return engine

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
        logits_processor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor | Iterator[AudioChunk]:
        """Generate codes (batch_size, 9, frames) for a prefix from :meth:`prepare_conditioning`, or with
        ``stream=True`` an iterator of :class:`zonos.streaming.AudioChunk` handed out as frames complete.

        Runs as one request on :attr:`engine`: calls from several threads, or a call while a stream is open,
        decode side by side in its slots (or wait for one), each giving what it would give alone.

        Args:
            prefix_conditioning: (2, L, d) cond ‖ uncond prefix (shared by the batch) or (2·batch_size, L, d).
            audio_prefix_codes: (1 or batch_size, 9, T) codes of audio to continue; returned codes include them.
            max_new_tokens: most frames to generate (86 ≈ one second).
            cfg_scale: classifier-free guidance; 1.0 turns it off (the conditional logits alone).
            sampling_params: :class:`zonos.sampling.SamplingParams` fields; default ``{"min_p": 0.1}``.
            progress_bar: show a tqdm bar.
            disable_torch_compile: accepted for upstream compatibility; nothing here compiles.
            callback: called as ``callback(frame, step, max_steps)`` after each decode step, on the engine's
                thread; generation continues only while it returns a true value (as upstream, ``None`` stops).
            generator: a ``torch.Generator`` (on the model's device or the CPU) the sequences' noise seeds are
                drawn from, for reproducible sampling; None draws them from torch's default CPU generator.
            stream: return an iterator of audio chunks instead of codes. Their codes concatenate to the
                one-shot codes of the same seed, their audio to ``autoencoder.decode`` of those codes.
                Closing the iterator early stops generation; the model is ready for the next request.
            first_chunk_frames: frames in the first chunk, after the vocoder's ~10-frame lookahead.
            chunk_frames: frames in the steady chunks; the chunks after the first double in size until they
                reach it, so that each arrives before the audio handed out so far has played.
            logits_processor: ``fn(logits (b, 9, V) float, step (b,) int64) -> logits`` applied before sampling
                (tensor work only: it is captured in the decode graph), e.g. to suppress EOS in benchmarks.

        EOS/MASK codes in the result are replaced by 0, as upstream does, so it decodes directly.
        """
        handle = self.submit(
            prefix_conditioning,
            audio_prefix_codes,
            max_new_tokens,
            cfg_scale,
            batch_size,
            sampling_params,
            progress_bar,
            disable_torch_compile,
            callback,
            generator,
            stream,
            first_chunk_frames,
            chunk_frames,
            logits_processor,
        )
        if stream:
            return _chunks(handle)
        try:
            return handle.result()
        finally:
            _close(handle)

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
        streams: int = 1,
        progress_bar: bool = True,
        logits_processor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        compile_ahead: bool | None = None,
        compile_threads: int | None = None,
        compile_processes: int = 0,
    ) -> float:
        """Pay now, behind a progress bar, what the first request would pay: two short streamed requests on
        random conditioning of ``prefix_length`` tokens compile and autotune the GPU kernels (Triton keeps
        both on disk, so only the first process on a machine waits long) and capture the CUDA graphs of the
        decode step, of the prefill pieces for that length and of the vocoder's pushes, which later requests
        replay. Graphs are keyed by the sampling filters in use and the number of busy slots, so pass the
        settings requests will use. ``all_prefill_lengths`` captures all 16 prefill piece sizes now (a server
        taking prompts of any length). ``streams`` > 1 (a server): the requests also run as many at a time as
        each bucket of :func:`~zonos.utils.batch_buckets` up to ``streams``, capturing the decode step of every
        bucket of busy slots up to there and, with the engine's ``vocoder_batching``, the slab push of every
        bucket of rows. ``logits_processor``: the one requests will pass (the step graphs are keyed by it). The bar
        names each Triton kernel as it is compiled. Returns the seconds it took; the model
        is ready for the next request.

        ``compile_ahead`` (None: on with CUDA graphs and the Triton sampler) first runs the requests once as a dry
        run that skips every Triton kernel not yet compiled and compiles them all on ``compile_threads`` threads
        (default: one per core; :mod:`zonos_accel.compile_ahead`), then, if it skipped any, replaces the engine
        (same settings, new graphs: read ``model.engine`` again after a warm-up) and warms up as above with every
        kernel compiled: on empty kernel caches the compiles overlap instead of running one after the other (H100,
        first audio 22.2 s after the model is ready against 43.4 s; ``benchmarks/first_request.py``).
        ``compile_processes`` > 0 compiles them in that many processes instead, which share no interpreter lock
        (the threads then only load what the processes wrote to the kernel cache; not yet timed on a GPU). Requests
        running during a warm-up are cancelled by that replacement.
        """
        for name, value in (("prefix_length", prefix_length), ("frames", frames), ("streams", streams)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ZonosInputError(f"warmup's {name} must be a positive int, got {value!r}")
        if isinstance(compile_processes, bool) or not isinstance(compile_processes, int) or compile_processes < 0:
            raise ZonosInputError(f"warmup's compile_processes must be an int ≥ 0, got {compile_processes!r}")
        engine = self.engine
        needed = prefix_length + frames + N_CODEBOOKS
        if needed > engine.max_seqlen:  # before the random prefix is allocated
            raise ZonosInputError(
                f"warmup's prefix_length {prefix_length} and {frames} frames need {needed} positions; the engine's "
                f"slots hold {engine.max_seqlen}"
            )
        if streams * batch_size > engine.slots.count:
            raise ZonosInputError(
                f"warmup's {streams} streams of batch {batch_size} need as many slots; the engine has "
                f"{engine.slots.count} (start_engine(slots=...))"
            )
        start = time.perf_counter()
        counts = batch_buckets(streams)
        d = self.config.backbone.d_model
        rows = 2 if cfg_scale != 1.0 else 1
        generator = torch.Generator(self.device).manual_seed(0)  # leaves the caller's random streams alone
        prefix = torch.randn(rows, prefix_length, d, device=self.device, generator=generator).to(self.dtype)
        total = 2 * frames * batch_size * sum(counts)

        def run(rounds: int, update: Callable[[int], object]) -> None:
            for n in counts:
                for _ in range(rounds):
                    handles = [
                        self.submit(
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
                            logits_processor=logits_processor,
                        )
                        for _ in range(n)
                    ]
                    for handle in handles:  # the engine runs them all while the first is read
                        for chunk in handle:
                            update((chunk.frames[1] - chunk.frames[0]) * batch_size)

        if compile_ahead is None:  # the torch sampler would draw from the dry run's unwritten logits
            fused_sampler = self.backend.op("sample_rows") is not REFERENCE.op("sample_rows")
            compile_ahead = self._graphs is not None and fused_sampler
        with (
            tqdm(total=total, desc="Warming up kernels and graphs", unit="frame", disable=not progress_bar) as bar,
            naming_compiles(bar),
        ):
            if compile_ahead and self.device.type == "cuda":
                self._compile_ahead(lambda: run(1, lambda frames: None), bar, compile_threads, compile_processes)
            run(2, bar.update)  # twice: the vocoder captures a push's graph the second time its shape occurs
            if all_prefill_lengths:
                bar.set_description("Capturing every prefill length")
                self.engine.prepare_prefill()  # the compile-ahead pass may have replaced the engine
        return time.perf_counter() - start

    def _compile_ahead(self, dry_run: Callable[[], None], bar, threads: int | None, processes: int = 0) -> None:
        """The warm-up's first pass (see :meth:`warmup`): ``dry_run`` with the Triton kernels it would compile
        skipped and compiled on threads, then a new engine (same settings) and graph cache in place of the ones
        the dry run ran on, whose graphs and states lack the skipped kernels' work."""
        from zonos_accel.compile_ahead import KernelRecorder
        from zonos_accel.graphs import GraphCache

        engine = self.engine
        bar.set_description("Compiling kernels")
        recorder = KernelRecorder(
            engine.on_worker_thread,
            self.device,
            threads,
            on_kernel=lambda name: bar.set_postfix_str(f"found {name}", refresh=True),
            processes=processes,
        )
        broke = False
        try:
            with recorder:
                dry_run()
        except Exception as err:  # noqa: BLE001 - the dry run's unwritten values broke it: compile one by one instead
            broke = True
            warnings.warn(
                f"the warm-up's compile-ahead pass failed ({err!r}); kernels compile at first use", stacklevel=4
            )
        finally:
            compiled, failed = recorder.finish()
            if recorder.found or broke:  # else nothing was skipped: what the run captured is sound
                self._graphs = GraphCache(self.device) if self._graphs is not None else None
                self.start_engine(
                    engine.slots.count, engine.max_seqlen, engine.queue_size, engine.vocoder_streams,
                    engine.vocoder_batching, engine.vocoder_frames,
                )  # fmt: skip
        bar.set_description("Warming up kernels and graphs")
        left = f", {failed} left to their first launch" if failed else ""
        where = f"{processes} processes" if processes else f"{recorder.workers} threads"
        bar.set_postfix_str(f"{compiled} kernels compiled on {where}{left}", refresh=True)


def _chunks(handle: RequestHandle) -> Iterator[AudioChunk]:
    """A stream's chunks, each of audio (batch, 1, n) and codes (batch, 9, n) as :class:`AudioChunk` promises (n may
    be 0); closing the iterator (or dropping it) cancels the request."""
    batch = handle.request.batch_size
    try:
        for chunk in handle:
            if chunk.audio.shape[0] != batch:
                # A stream stopped before its first frame (callback, EOS at once) ends with the flush of a vocoder
                # that never saw a push, so it does not know the batch: (0, 1, 0), on which audio[0, 0] fails.
                audio = chunk.audio.new_zeros(batch, 1, 0)
                chunk = dataclasses.replace(chunk, audio=audio, codes=chunk.codes.new_zeros(batch, N_CODEBOOKS, 0))
            yield chunk
    finally:
        _close(handle)


def _close(handle: RequestHandle) -> None:
    """Cancel the request if it still runs, and close its progress bar."""
    handle.cancel()
    if handle.request.progress is not None:
        handle.request.progress.close()


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
