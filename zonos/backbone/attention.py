"""Grouped-query causal self-attention with rotary embeddings and a preallocated KV cache, and the gated MLP."""

from __future__ import annotations

import torch
import torch.nn as nn

from zonos.ops.backend import UsesOps


class KVCache:
    """Per-layer keys and values for ``max_seqlen`` positions (fixed addresses)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k = k  # (b, max_seqlen, kv_heads, head_dim)
        self.v = v

    def zero_(self) -> None:
        self.k.zero_()
        self.v.zero_()


class Attention(UsesOps, nn.Module):
    """mamba_ssm-style MHA: one fused qkv projection (q heads, then k heads, then v heads), rotary, and
    attention over the KV cache."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_heads_kv: int,
        head_dim: int,
        rotary_emb_dim: int,
        rotary_emb_base: float,
        rotary_emb_interleaved: bool,
        qkv_proj_bias: bool,
        out_proj_bias: bool,
        causal: bool = True,
    ):
        super().__init__()
        if not causal:
            raise ValueError("attn_cfg.causal=False is not supported: Zonos decodes autoregressively")
        self.num_heads, self.num_heads_kv, self.head_dim = num_heads, num_heads_kv, head_dim
        self.rotary_dim, self.rotary_base, self.interleaved = rotary_emb_dim, rotary_emb_base, rotary_emb_interleaved
        self.in_proj = nn.Linear(d_model, (num_heads + 2 * num_heads_kv) * head_dim, bias=qkv_proj_bias)
        self.out_proj = nn.Linear(num_heads * head_dim, d_model, bias=out_proj_bias)

    def allocate_cache(self, batch_size: int, max_seqlen: int, device: torch.device, dtype: torch.dtype) -> KVCache:
        shape = (batch_size, max_seqlen, self.num_heads_kv, self.head_dim)
        return KVCache(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    def _attend(self, qkv: torch.Tensor, cache: KVCache, position: torch.Tensor, decode: bool) -> torch.Tensor:
        """Attention from the projected ``qkv`` (b, l, (q + 2·kv heads)·head_dim) through ``out_proj``."""
        b, l, _ = qkv.shape
        q, k, v = torch.split(
            qkv,
            [self.num_heads * self.head_dim, self.num_heads_kv * self.head_dim, self.num_heads_kv * self.head_dim],
            -1,
        )
        # (b, l): each row at its own position; a decode token's is the row's position itself (no kernels)
        positions = position[:, None] if l == 1 else position[:, None] + torch.arange(l, device=qkv.device)
        q = self.ops.rotate_and_cache(
            q.view(b, l, self.num_heads, self.head_dim),
            k.view(b, l, self.num_heads_kv, self.head_dim),
            v.view(b, l, self.num_heads_kv, self.head_dim),
            cache.k,
            cache.v,
            positions,
            self.rotary_dim,
            self.rotary_base,
            self.interleaved,
        )
        attention = self.ops.decode_attention if decode else self.ops.prefill_attention
        o = attention(q, cache.k, cache.v, position)
        return self.ops.linear(
            o.reshape(b, l, self.num_heads * self.head_dim), self.out_proj.weight, self.out_proj.bias
        )

    def forward(self, u: torch.Tensor, cache: KVCache, position: torch.Tensor) -> torch.Tensor:
        """Process (b, l, d) tokens at positions ``position`` .. ``position + l - 1`` (``position`` (b,) on the
        device, one per row), writing their keys and values to the cache; attends over the whole preallocated cache with
        a causal mask, so the same kernels serve every position (graph-safe). The caller checks the bounds."""
        qkv = self.ops.linear(u, self.in_proj.weight, self.in_proj.bias)
        return self._attend(qkv, cache, position, decode=False)

    def step(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm: nn.LayerNorm,
        cache: KVCache,
        position: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token (b, 1, d) per row at that row's ``position`` (b,), entering through the block's pre-norm:
        residual ← hidden + residual, ``norm``, then attention over the whole preallocated cache with a mask (the
        same kernels serve every position: graph-safe). Returns (output, residual). The norm and the qkv projection
        are one op (``add_layer_norm_linear``), so a fused kernel can serve them."""
        qkv, residual = self.ops.add_layer_norm_linear(
            hidden, residual, norm.weight, norm.bias, norm.eps, self.in_proj.weight, self.in_proj.bias
        )
        return self._attend(qkv, cache, position, decode=True), residual


class GatedMLP(UsesOps, nn.Module):
    """fc1 → [value | gate] → value · SiLU(gate) → fc2, no biases."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.fc2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(self.ops.silu_mul(self.ops.linear(x, self.fc1.weight)), self.fc2.weight)

    def step(
        self, hidden: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP half of a block for decode tokens, entering through its pre-norm (residual ← hidden + residual,
        ``norm``); the norm, fc1 and the activation are one op (``add_layer_norm_glu``), so a fused kernel can serve
        them. Returns (output, residual)."""
        act, residual = self.ops.add_layer_norm_glu(hidden, residual, norm.weight, norm.bias, norm.eps, self.fc1.weight)
        return self.ops.linear(act, self.fc2.weight), residual
