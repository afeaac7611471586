"""Triton fast paths behind :mod:`zonos.ops` (the stock GPU path).

``triton_backend(base)`` returns a :class:`zonos.ops.backend.Backend` whose ops are these fast versions (the
others as in ``base``); a model runs it once it is handed to the model (``Zonos.use_accelerators``). Tensors
not on a CUDA device still run the reference.

| op | fast path | source |
|---|---|---|
| ``ssd_step`` | the Mamba2 selective state update, one launch | ours (:mod:`.state_update`) |
| ``gated_rms_norm`` | fused gated RMSNorm | ours (:mod:`.gated_norm`) |
| ``ssd_scan`` | the chunked prefill scan in three launches, any length | ours (:mod:`.ssd_scan`) |
| ``conv_step`` | one kernel: shift, conv, bias, SiLU | ours (:mod:`.conv`) |
| ``decode_attention`` | split-K GQA over rows ≤ position | ours (:mod:`.attention`) |
| ``prefill_attention`` | flash-style causal GQA over rows ≤ position + i | ours (:mod:`.attention`) |
| ``add_layer_norm`` | residual add + LayerNorm, one kernel | ours (:mod:`.norms`) |
| ``rotate_and_cache`` | rotary on q and k, k and v into the KV cache, one launch | ours (:mod:`.rotary`) |
| ``silu_mul`` | the gated MLP's value · SiLU(gate), one launch | ours (:mod:`.activations`) |
| ``embedding_sum`` | offset, lookup and sum of the 9 codebook embeddings, one launch | ours (:mod:`.embedding`) |
| ``codebook_rows`` | the DAC's codebook rows: range, clamp, lookup, transpose, one launch | ours (:mod:`.embedding`) |
| ``snake`` | the DAC's Snake activation, one launch, output in the next conv's dtype | ours (:mod:`.snake`) |
| ``conv1d`` | a DAC conv: conv, bias, residual, tanh; sums in a length-independent order | ours (:mod:`.vocoder`) |
| ``conv_transpose1d`` | a DAC upsampling conv: transposed conv, bias, crop; the same | ours (:mod:`.vocoder`) |
| ``sequence_tail`` | a streaming layer's next history, in place | ours (:mod:`.vocoder`) |
| ``sample_rows`` | per-row sampling, one launch (opt-in: not in :data:`DEFAULT_OPS`) | ours (:mod:`.sampler`) |
| ``finish_rows`` | the step's EOS bookkeeping and column write, one launch (opt-in too) | ours (:mod:`.sampler`) |
| ``mamba_block_step`` | a Mamba2 block's decode step, three launches, ≤ 16 rows (opt-in) | ours (:mod:`.mamba_block`) |
| ``add_layer_norm_linear`` | a block's add + LayerNorm in the next GEMV (opt-in) | ours (:mod:`.norm_linear`) |
| ``add_layer_norm_glu`` | the same into fc1, with the gated MLP's activation (opt-in) | ours (:mod:`.norm_linear`) |
| ``linear`` | decode-shaped projections (≤ 16 rows) on the same GEMV, cuBLAS otherwise (opt-in) | ours (:mod:`.gemv`) |
"""

from __future__ import annotations

import functools
import importlib

import torch

from zonos.ops.backend import COMPOSITES, REFERENCE, Backend, Fused
from zonos_accel.triton.mamba import INSTALL_HINT

# op -> the module of its fast path (ours: they need triton alone).
_SOURCES = {
    "ssd_step": "zonos_accel.triton.state_update",
    "gated_rms_norm": "zonos_accel.triton.gated_norm",
    "ssd_scan": "zonos_accel.triton.ssd_scan",
    "conv_step": "zonos_accel.triton.conv",
    "decode_attention": "zonos_accel.triton.attention",
    "prefill_attention": "zonos_accel.triton.attention",
    "add_layer_norm": "zonos_accel.triton.norms",
    "rotate_and_cache": "zonos_accel.triton.rotary",
    "silu_mul": "zonos_accel.triton.activations",
    "snake": "zonos_accel.triton.snake",
    "embedding_sum": "zonos_accel.triton.embedding",
    "codebook_rows": "zonos_accel.triton.embedding",
    "conv1d": "zonos_accel.triton.vocoder",
    "conv_transpose1d": "zonos_accel.triton.vocoder",
    "sequence_tail": "zonos_accel.triton.vocoder",
    "sample_rows": "zonos_accel.triton.sampler",
    "finish_rows": "zonos_accel.triton.sampler",
    "mamba_block_step": "zonos_accel.triton.mamba_block",
    "add_layer_norm_linear": "zonos_accel.triton.norm_linear",
    "add_layer_norm_glu": "zonos_accel.triton.norm_linear",
    "linear": "zonos_accel.triton.gemv",
}
OPS = tuple(_SOURCES)
# What triton_backend runs by default: all but the fused sampling and step bookkeeping, which
# ``Zonos.use_accelerators`` adds unless ``fused_sampling=False`` (a backend built here compares without them).
FUSED_SAMPLING_OPS = ("sample_rows", "finish_rows")
# Every block's decode step through fused GEMVs, and the step's other projections on the same GEMV
# (``use_accelerators(fused_blocks=True)``): opt-in until it is timed against the op-by-op step (docs/BENCHMARKS.md,
# decisions: fused_blocks). With ``use_cute_gemv`` the plain projections run the CuTeDSL GEMV instead.
FUSED_BLOCK_OPS = ("mamba_block_step", "add_layer_norm_linear", "add_layer_norm_glu", "linear")
DEFAULT_OPS = tuple(op for op in OPS if op not in FUSED_SAMPLING_OPS + FUSED_BLOCK_OPS)


def fast_op(name: str):
    """The fast version of ``zonos.ops.<name>`` (raises ImportError naming what is missing)."""
    try:
        return getattr(importlib.import_module(_SOURCES[name]), name)
    except ImportError as e:
        raise ImportError(f"the Triton fast path of {name} needs triton ({e}); install it with {INSTALL_HINT}") from e


def fast_entry(name: str):
    """What a backend is given for op ``name``'s fast path (``Backend.replace``): a :class:`Fused` (the kernel and
    the calls it fits) for a composite op, else the fast function itself (which takes the tensors it is given: on the
    CPU only under Triton's interpreter)."""
    fast = fast_op(name)
    return Fused(fast, importlib.import_module(_SOURCES[name]).fits) if name in COMPOSITES else fast


def _on_cuda(fast, reference):
    @functools.wraps(reference)
    def op(*args, **kwargs):
        if args[0].is_cuda:
            return fast(*args, **kwargs)
        return reference(*args, **kwargs)

    return op


def triton_backend(base: Backend = REFERENCE, names: tuple[str, ...] = DEFAULT_OPS) -> Backend:
    """``base`` with the named ops (default: :data:`DEFAULT_OPS`) on their Triton fast paths (CUDA tensors; others
    run ``base``'s op). Raises RuntimeError without a CUDA device and ImportError naming a missing package."""
    if not torch.cuda.is_available():
        raise RuntimeError("the Triton fast paths need a CUDA device, and torch sees none")
    unknown = set(names) - set(OPS)
    if unknown:
        raise ValueError(f"unknown op(s) {sorted(unknown)}; known: {list(OPS)}")
    fast = {}
    for name in names:
        entry = fast_entry(name)  # a Fused kernel serves where it fits, the composition of the parts elsewhere
        fast[name] = entry if isinstance(entry, Fused) else _on_cuda(entry, base.op(name))
    return base.replace(f"{base.name}+triton" if base.name != "torch" else "triton", **fast)
