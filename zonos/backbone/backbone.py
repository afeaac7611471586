"""The Zonos backbone: pre-norm residual blocks (Mamba2 or attention + MLP) and a final LayerNorm.

Numerics follow mamba_ssm's ``Block``: the residual stream is carried beside the hidden state, and each
block first adds (residual += hidden) and then normalizes. That is the same function as
``h + mixer(norm(h))``, and keeps rounding identical to upstream's bf16 path.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn as nn

from zonos.backbone.attention import Attention, GatedMLP, KVCache
from zonos.backbone.mamba2 import Mamba2Cache, Mamba2Mixer
from zonos.config import BackboneConfig
from zonos.ops.backend import UsesOps


class Block(UsesOps, nn.Module):
    """norm → mixer, then (attention layers) norm2 → MLP; residual additions outside, as in mamba_ssm."""

    def __init__(self, mixer: nn.Module, d_model: int, mlp_hidden: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.mixer = mixer
        if mlp_hidden > 0:
            self.norm2 = nn.LayerNorm(d_model, eps=eps)
            self.mlp = GatedMLP(d_model, mlp_hidden)
        else:
            self.mlp = None

    def _mlp(self, hidden: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mlp is None:
            return hidden, residual
        normed, residual = _add_norm(self.ops, hidden, residual, self.norm2)
        return self.mlp(normed), residual

    def forward(self, hidden, residual, cache, position: torch.Tensor, valid: torch.Tensor | None = None):
        normed, residual = _add_norm(self.ops, hidden, residual, self.norm)
        if isinstance(self.mixer, Attention):
            # Padding past a row's valid tokens writes keys and values past them, which its own valid queries
            # never see (causal) and which later tokens at those positions overwrite.
            hidden = self.mixer(normed, cache, position)
        else:
            hidden = self.mixer(normed, cache, valid)
        return self._mlp(hidden, residual)

    def step(self, hidden, residual, cache, position: torch.Tensor):
        # The mixers' and the MLP's steps take their pre-norms in, so one op (a fused kernel) can serve each norm
        # with the projection after it.
        if isinstance(self.mixer, Attention):
            hidden, residual = self.mixer.step(hidden, residual, self.norm, cache, position)
        else:
            hidden, residual = self.mixer.step(hidden, residual, self.norm, cache)
        if self.mlp is None:
            return hidden, residual
        return self.mlp.step(hidden, residual, self.norm2)


def _add_norm(ops, hidden, residual, norm: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """residual ← hidden + residual, then ``norm`` of it (one op, so a fused kernel can serve it)."""
    return ops.add_layer_norm(hidden, residual, norm.weight, norm.bias, norm.eps)


_SERIALS = itertools.count()


class InferenceState:
    """Every layer's decode cache for ``batch_size`` sequences of up to ``max_seqlen`` tokens.

    Tensors are allocated once and only written in place, so a CUDA graph of the decode step or of a
    prefill piece captured against one state stays valid for every later request that reuses it. The
    number of tokens consumed is kept twice: ``position``, a device tensor with one entry per row, is what
    the kernels read (the KV rows to write and attend to; rows may sit at different positions), and
    ``seqlen``, a host int, is bookkeeping for bounds checks when every row advances together (a replayed
    graph advances ``position`` itself; its runner advances ``seqlen``). A state whose rows advance
    separately (the engine's slots) sets ``seqlen`` to None and checks bounds itself.
    """

    def __init__(self, caches: list[Mamba2Cache | KVCache], batch_size: int, max_seqlen: int, device: torch.device):
        self.caches = caches
        self.batch_size = batch_size
        self.max_seqlen = max_seqlen
        self.seqlen: int | None = 0
        self.position = torch.zeros(batch_size, dtype=torch.long, device=device)
        # Never reused in the process (``id()`` is, once a state is freed): CUDA graphs captured on this state's
        # tensors are keyed by it, so a later state cannot replay into this one's freed memory.
        self.serial = next(_SERIALS)

    def reset(self) -> None:
        """Forget every sequence (zeroes the caches in place; addresses are kept)."""
        for c in self.caches:
            c.zero_()
        if self.seqlen is not None:
            self.seqlen = 0
        self.position.zero_()


class ZonosBackbone(UsesOps, nn.Module):
    """``layers`` (Mamba2 blocks, attention blocks at ``attn_layer_idx``) and ``norm_f``."""

    def __init__(self, config: BackboneConfig):
        super().__init__()
        if config.rms_norm:
            raise ValueError("backbone.rms_norm=True is not supported: the published checkpoints use LayerNorm")
        if config.residual_in_fp32:
            raise ValueError("backbone.residual_in_fp32=True is not supported: the published checkpoints use false")
        self.config = config
        attn = config.attention()
        ssm = config.mamba2() if config.is_hybrid else None
        attn_layers = set(config.attn_layer_idx)
        if not config.is_hybrid and attn_layers != set(range(config.n_layer)):
            raise ValueError("a config with an empty ssm_cfg must list every layer in attn_layer_idx")
        layers = []
        for i in range(config.n_layer):
            if i in attn_layers:
                mixer = Attention(config.d_model, **attn)
                mlp_hidden = config.attn_mlp_d_intermediate
            else:
                mixer = Mamba2Mixer(config.d_model, norm_eps=config.norm_epsilon, **ssm)
                mlp_hidden = config.d_intermediate
            layers.append(Block(mixer, config.d_model, mlp_hidden, config.norm_epsilon))
        self.layers = nn.ModuleList(layers)
        self.norm_f = nn.LayerNorm(config.d_model, eps=config.norm_epsilon)

    def allocate_inference_state(
        self,
        batch_size: int,
        max_seqlen: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> InferenceState:
        """Preallocate caches; device and dtype default to the model's."""
        p = self.norm_f.weight
        device = torch.device(device) if device is not None else p.device
        dtype = dtype or p.dtype
        caches = [
            layer.mixer.allocate_cache(batch_size, max_seqlen, device, dtype)
            if isinstance(layer.mixer, Attention)
            else layer.mixer.allocate_cache(batch_size, device, dtype)
            for layer in self.layers
        ]
        return InferenceState(caches, batch_size, max_seqlen, device)

    def _check(self, hidden: torch.Tensor, state: InferenceState, n: int) -> None:
        if hidden.shape[0] != state.batch_size:
            raise ValueError(f"batch of {hidden.shape[0]} does not match the inference state's {state.batch_size}")
        if state.seqlen is not None and state.seqlen + n > state.max_seqlen:
            raise ValueError(
                f"{state.seqlen + n} tokens exceed the inference state's maximum of {state.max_seqlen}: "
                "allocate a larger state (or generate fewer tokens)"
            )

    def _final(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return _add_norm(self.ops, hidden, residual, self.norm_f)[0]

    def forward(self, hidden: torch.Tensor, state: InferenceState, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Prefill: (b, l, d) embeddings that follow the tokens already consumed → (b, l, d).

        The tokens go at ``state.position`` (a device tensor, one entry per row), which this advances on the device,
        so a sequence may arrive in pieces of any sizes and each piece runs the same kernels at every position
        (graph-safe: zonos_accel.graphs replays one graph per piece size). A replayed graph does not run this
        Python, so a graph runner advances ``state.seqlen`` itself.

        ``valid`` (b,) int64 on the device, for a batch of sequences of unequal lengths: row i consumes only its
        first ``valid[i]`` tokens (0 to l; the rest is padding whose outputs mean nothing) and its position
        advances by that many, so its state is the one its valid tokens alone leave. ``state.seqlen`` counts l.
        """
        l = hidden.shape[1]
        self._check(hidden, state, l)
        if state.seqlen is not None:
            state.seqlen += l
        residual = None
        for layer, cache in zip(self.layers, state.caches):
            hidden, residual = layer(hidden, residual, cache, state.position, valid)
        state.position.add_(l if valid is None else valid)
        return self._final(hidden, residual)

    def step(self, hidden: torch.Tensor, state: InferenceState) -> torch.Tensor:
        """Decode one token (b, 1, d) → (b, 1, d) at ``state.position``; advances it on the device.

        Graph-safe: no host reads of device values. A replayed graph does not run this Python, so a graph
        runner advances ``state.seqlen`` itself.
        """
        self._check(hidden, state, 1)
        if state.seqlen is not None:
            state.seqlen += 1
        residual = None
        for layer, cache in zip(self.layers, state.caches):
            hidden, residual = layer.step(hidden, residual, cache, state.position)
        state.position.add_(1)
        return self._final(hidden, residual)
