"""The Mamba2 mixer (mamba_ssm's ``Mamba2`` with the defaults Zonos uses), split into prefill and step."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from zonos.ops.backend import UsesOps
from zonos.ops.conv import conv_context
from zonos.ops.precision import compute_dtype


class Mamba2Cache:
    """Per-layer decode cache: the last ``d_conv`` conv inputs and the SSM state (fixed addresses), and the
    ``counters`` a fused decode step counts its programs with (zeros between steps: the kernel that counts leaves
    them so, which saves it a memset per launch; shared by every row, as the layer's steps run one after another)."""

    def __init__(self, conv: torch.Tensor, ssm: torch.Tensor, counters: torch.Tensor | None = None):
        self.conv = conv  # (b, conv_dim, d_conv)
        self.ssm = ssm  # (b, heads, headdim, d_state)
        self.counters = counters  # (heads,) int32

    def rows(self, start: int, stop: int) -> Mamba2Cache:
        """Rows ``start .. stop`` as a cache of their own (views; the same counters)."""
        return Mamba2Cache(self.conv[start:stop], self.ssm[start:stop], self.counters)

    def zero_(self) -> None:
        self.conv.zero_()
        self.ssm.zero_()
        if self.counters is not None:
            self.counters.zero_()


class Mamba2Mixer(UsesOps, nn.Module):
    """in_proj → [z | x B C | dt] → causal conv + SiLU on xBC → SSD → gated RMSNorm with z → out_proj."""

    def __init__(
        self,
        d_model: int,
        d_state: int = 128,
        d_conv: int = 4,
        expand: int = 2,
        headdim: int = 64,
        ngroups: int = 1,
        chunk_size: int = 256,
        norm_eps: float = 1e-5,
    ):
        super().__init__()
        self.d_inner = expand * d_model
        if self.d_inner % headdim:
            raise ValueError(f"expand * d_model = {self.d_inner} is not a multiple of headdim = {headdim}")
        self.nheads = self.d_inner // headdim
        self.headdim, self.d_state, self.d_conv = headdim, d_state, d_conv
        self.ngroups, self.chunk_size, self.norm_eps = ngroups, chunk_size, norm_eps
        self.conv_dim = self.d_inner + 2 * ngroups * d_state

        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * ngroups * d_state + self.nheads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim, padding=d_conv - 1)
        self.dt_bias = nn.Parameter(torch.empty(self.nheads))
        self.A_log = nn.Parameter(torch.empty(self.nheads))
        self.D = nn.Parameter(torch.empty(self.nheads))
        self.norm = nn.Module()  # keeps the checkpoint name ``mixer.norm.weight``
        self.norm.weight = nn.Parameter(torch.empty(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)
        # The decay rates -exp(A_log), derived once rather than by three small kernels per layer per step. Not a
        # buffer (a cast of the module would round it, and it stays out of the state dict): refresh_A derives it
        # again after load_state_dict, casts and moves.
        self.A: torch.Tensor | None = None
        self.register_load_state_dict_post_hook(_refresh_A_after_load)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Random initialization in mamba_ssm's ranges (real weights come from the checkpoint)."""
        if not self.dt_bias.is_meta:
            with torch.no_grad():
                dt = torch.exp(torch.rand(self.nheads) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
                self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
                self.A_log.copy_(torch.log(torch.empty(self.nheads).uniform_(1, 16)))
                self.D.fill_(1.0)
                self.norm.weight.fill_(1.0)
        self.refresh_A()

    @torch.no_grad()
    def refresh_A(self) -> None:
        """A = -exp(A_log) in the compute dtype (float32, or float64 for a float64 A_log), as mamba_ssm
        computes it at every call. Runs after load_state_dict and casts; call it after editing A_log in place.

        Writes in place when the dtype and device are unchanged, so CUDA graphs that read A stay valid.
        """
        dtype = compute_dtype(self.A_log.dtype)
        if self.A_log.is_meta:  # shape only: an op on meta tensors would import torch._dynamo (seconds)
            A = torch.empty_like(self.A_log, dtype=dtype)
        else:
            A = -torch.exp(self.A_log.to(dtype))
        old = self.A
        same = old is not None and (old.shape, old.dtype, old.device) == (A.shape, A.dtype, A.device)
        if same and not A.is_meta and (not old.is_inference() or torch.is_inference_mode_enabled()):
            old.copy_(A)
        else:
            self.A = A

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.refresh_A()  # a cast of A_log (e.g. to bf16) must not round A: derive it again
        return self

    def allocate_cache(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> Mamba2Cache:
        return Mamba2Cache(
            torch.zeros(batch_size, self.conv_dim, self.d_conv, device=device, dtype=dtype),
            torch.zeros(batch_size, self.nheads, self.headdim, self.d_state, device=device, dtype=dtype),
            torch.zeros(self.nheads, device=device, dtype=torch.int32),
        )

    def _split(self, zxbcdt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.split(zxbcdt, [self.d_inner, self.conv_dim, self.nheads], dim=-1)

    def _dt_A(self, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step sizes softplus(dt + dt_bias) and decay rates A = -exp(A_log), in at least float32."""
        cdt = compute_dtype(dt.dtype)
        return F.softplus(dt.to(cdt) + self.dt_bias.to(cdt)), self.A.to(cdt)

    def _out(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = self.ops.gated_rms_norm(y, z, self.norm.weight, self.norm_eps, self.d_inner // self.ngroups)
        return self.ops.linear(y, self.out_proj.weight)

    def forward(self, u: torch.Tensor, cache: Mamba2Cache, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Process (b, l, d) tokens that follow the ones the cache has seen; updates the cache.

        The conv's left context and the scan's initial state always come from the cache (zeros after
        ``InferenceState.reset``), so the first piece of a sequence is not a special case and the same
        kernels serve every position (graph-safe). ``valid`` (b,) on the device: row i's tokens from
        ``valid[i]`` on are padding, which leaves its cache as its valid tokens left it (their step sizes are 0:
        the scan's state passes through them unchanged; the conv's context ends at the last valid token).
        """
        b, l, _ = u.shape
        z, xbc, dt = self._split(self.ops.linear(u, self.in_proj.weight))
        new_context = conv_context(xbc, self.d_conv, cache.conv, valid)
        xbc = self.ops.causal_conv1d(xbc, self.conv1d.weight, self.conv1d.bias, cache.conv)
        cache.conv.copy_(new_context)
        x, B, C = torch.split(xbc, [self.d_inner, self.ngroups * self.d_state, self.ngroups * self.d_state], dim=-1)
        dt, A = self._dt_A(dt)
        if valid is not None:
            dt = dt.masked_fill((torch.arange(l, device=u.device) >= valid[:, None])[..., None], 0.0)
        y, final = self.ops.ssd_scan(
            x.reshape(b, l, self.nheads, self.headdim),
            dt,
            A,
            B.reshape(b, l, self.ngroups, self.d_state),
            C.reshape(b, l, self.ngroups, self.d_state),
            self.chunk_size,
            D=self.D,
            initial_state=cache.ssm,
        )
        cache.ssm.copy_(final)
        return self._out(y.reshape(b, l, self.d_inner), z)

    def step(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, norm: nn.LayerNorm, cache: Mamba2Cache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token of the block around this mixer: residual ← hidden + residual, ``norm`` (the block's
        pre-norm), then the mixer; ``hidden`` and ``residual`` (b, 1, d). Returns (output, residual), both
        (b, 1, d), and updates the cache in place (no host work, graph-safe). One op
        (``mamba_block_step``), so a fused kernel can serve the whole block."""
        b, _, d = hidden.shape
        out, residual = self.ops.mamba_block_step(
            hidden.reshape(b, d), None if residual is None else residual.reshape(b, d),
            norm.weight, norm.bias, norm.eps, self.in_proj.weight,
            cache.conv, self.conv1d.weight, self.conv1d.bias, cache.ssm,
            self.A.to(compute_dtype(hidden.dtype)), self.D, self.dt_bias,  # softplus(dt + dt_bias) inside the op
            self.norm.weight, self.norm_eps, self.out_proj.weight, cache.counters,
        )  # fmt: skip
        return out[:, None], residual[:, None]


def _refresh_A_after_load(mixer: Mamba2Mixer, incompatible_keys) -> None:
    mixer.refresh_A()
