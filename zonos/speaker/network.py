"""ResNet293 with SimAM attention and attentive statistics pooling: log-mel features -> 256-d embedding.

Module names follow the published checkpoint ``ResNet293_SimAM_ASP_base.pt``: ``front.*`` (the
ResNet trunk), ``pooling.attention.{0,2,3}.*`` and ``bottleneck.*``.  Sizes are configurable so tests
can build a tiny copy; :class:`SpeakerNetConfig`'s defaults are the published model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

__all__ = ["SpeakerNetConfig", "simam", "SimAMBasicBlock", "ResNetTrunk", "AttentiveStatsPool", "ResNetSimAMASP"]


@dataclass(frozen=True)
class SpeakerNetConfig:
    """Sizes of the speaker network and its LDA projection (defaults: the published Zonos model).

    ``in_planes`` is the stem width; stage ``i`` has ``in_planes * 2**i`` channels and ``num_blocks[i]``
    blocks.  ``n_mels`` must be divisible by 8 (three stride-2 stages halve the mel axis).
    """

    in_planes: int = 64
    num_blocks: tuple[int, int, int, int] = (10, 20, 64, 3)
    n_mels: int = 80
    attention_dim: int = 128
    embed_dim: int = 256
    lda_dim: int = 128

    def __post_init__(self) -> None:
        if self.n_mels % 8:
            raise ValueError(f"n_mels must be divisible by 8, got {self.n_mels}")
        if len(self.num_blocks) != 4 or min(self.num_blocks) < 1:
            raise ValueError(f"num_blocks needs 4 positive block counts, got {self.num_blocks}")

    @property
    def pooled_channels(self) -> int:
        """Rows fed to the pooling: last-stage channels times the remaining mel rows."""
        return self.in_planes * 8 * (self.n_mels // 8)


def simam(x: Tensor, lam: float = 1e-4) -> Tensor:
    """Parameter-free SimAM attention over each channel's ``H x W`` map of ``x [B, C, H, W]``.

    Each activation is weighted by ``sigmoid(d / (4 (v + lam)) + 0.5)``, where ``d`` is its squared
    deviation from the map's mean and ``v`` the map's unbiased variance: distinctive units get more weight.
    """
    d = (x - x.mean(dim=(2, 3), keepdim=True)).square()
    v = d.sum(dim=(2, 3), keepdim=True) / (x.shape[2] * x.shape[3] - 1)
    return x * torch.sigmoid(d / (4 * (v + lam)) + 0.5)


class SimAMBasicBlock(nn.Module):
    """Two 3x3 conv + BN layers, SimAM, then a residual add and ReLU.

    The shortcut is a 1x1 conv + BN (``downsample.0`` / ``downsample.1``) when the stride or the width
    changes, the identity otherwise.
    """

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() or self.training:
            h = F.relu(self.bn1(self.conv1(x)))
            h = simam(self.bn2(self.conv2(h)))
            return F.relu(h + self.downsample(x))
        # Inference: the same arithmetic in place and in time windows (:func:`_conv_windows`), so besides the
        # input one block-sized tensor is alive, plus window-sized temporaries. A 10-minute 44.1 kHz clip through
        # SpeakerEmbedding.embed (trimmed to 30 s; published sizes, random weights, CPU, peak RSS growth over the
        # call): 471 MB out of place, 351 MB in place, 197 MB in 256-frame windows, 178 MB in 128-frame windows.
        h = _batch_norm_(_conv_windows(x, self.conv1), self.bn1).relu_()
        h = _batch_norm_(_conv_windows(h, self.conv2, out=h), self.bn2)
        _simam_(h)
        if isinstance(self.downsample, nn.Identity):
            return h.add_(x).relu_()
        conv, bn = self.downsample
        return h.add_(_batch_norm_(_conv_windows(x, conv), bn)).relu_()


# Time frames per window of the inference path's convs and SimAM: 2.6 MB per stage-1 window (64 x 80 x 128
# floats); 256 frames measured 19 MB more peak memory for a 30 s clip (see SimAMBasicBlock.forward).
CONV_WINDOW = 128


def _conv_windows(x: Tensor, conv: nn.Conv2d, out: Tensor | None = None) -> Tensor:
    """``conv(x)`` for ``x [B, C, H, W]`` computed over windows of :data:`CONV_WINDOW` output columns (time),
    each from its own slice of ``x`` with the conv's halo, so the temporaries are window-sized.

    ``out=x`` (a stride-1 conv keeping the shape) overwrites ``x`` with the result: the ``padding`` input
    columns left of each window, already overwritten by the previous window, are kept aside before it is written.
    """
    (kh, kw), (sh, sw), (ph, pw) = conv.kernel_size, conv.stride, conv.padding
    width = x.shape[-1]
    out_width = (width + 2 * pw - kw) // sw + 1
    if out_width <= CONV_WINDOW and out is None:
        return conv(x)
    in_place = out is x
    if in_place and (sw != 1 or out_width != width or conv.out_channels != x.shape[1]):
        raise ValueError("an in-place windowed conv needs stride 1 and an output shaped like its input")
    if out is None:
        out_height = (x.shape[2] + 2 * ph - kh) // sh + 1
        out = x.new_empty(x.shape[0], conv.out_channels, out_height, out_width)
    kept = None  # for in_place: the original input columns [a - pw, a) of the current window
    for a in range(0, out_width, CONV_WINDOW):
        b = min(a + CONV_WINDOW, out_width)
        lo, hi = a * sw - pw, (b - 1) * sw + kw - pw  # input columns this window reads
        if in_place and kept is not None:
            piece = torch.cat([kept, x[..., a : min(hi, width)]], dim=-1)
        else:
            piece = x[..., max(lo, 0) : min(hi, width)]
        piece = F.pad(piece, (max(-lo, 0), max(hi - width, 0)))
        result = F.conv2d(piece, conv.weight, conv.bias, stride=(sh, sw), padding=(ph, 0))
        if in_place:
            kept = x[..., max(b - pw, 0) : b].clone()
        out[..., a:b] = result
    return out


def _batch_norm_(x: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    """Eval-mode BatchNorm of ``x [B, C, H, W]`` in place: ``(x - mean) / sqrt(var + eps) * weight + bias``."""
    scale = (bn.running_var + bn.eps).rsqrt() * bn.weight
    shift = bn.bias - bn.running_mean * scale
    return x.mul_(scale[:, None, None]).add_(shift[:, None, None])


def _simam_(x: Tensor, lam: float = 1e-4) -> Tensor:
    """:func:`simam` in place on ``x``, window by window along time (no temporary the size of ``x``)."""
    mean = x.mean(dim=(2, 3), keepdim=True)
    windows = range(0, x.shape[-1], CONV_WINDOW)
    d_sum = sum((x[..., a : a + CONV_WINDOW] - mean).square().sum(dim=(2, 3), keepdim=True) for a in windows)
    scale = 4 * (d_sum / (x.shape[2] * x.shape[3] - 1) + lam)
    for a in windows:
        window = x[..., a : a + CONV_WINDOW]
        window.mul_((window - mean).square_().div_(scale).add_(0.5).sigmoid_())
    return x


class ResNetTrunk(nn.Module):
    """Stem (3x3 conv, BN, ReLU) and four stages.

    ``[B, 1, n_mels, T] -> [B, 8 * in_planes, n_mels / 8, ceil(T / 8)]``; stages 2-4 halve both axes.
    """

    def __init__(self, in_planes: int, num_blocks: tuple[int, int, int, int]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, in_planes, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(in_planes)
        channels = in_planes
        for i, (blocks, stride) in enumerate(zip(num_blocks, (1, 2, 2, 2))):
            width = in_planes * 2**i
            layer = [SimAMBasicBlock(channels, width, stride)]
            layer += [SimAMBasicBlock(width, width) for _ in range(blocks - 1)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*layer))
            channels = width

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() or self.training:
            x = F.relu(self.bn1(self.conv1(x)))
            return self.layer4(self.layer3(self.layer2(self.layer1(x))))
        # Inference: one block at a time, each output replacing ``x``, so no earlier activation stays referenced
        # (nested calls kept the stem's 61 MB output alive through layer1 for a 30 s clip).
        x = _batch_norm_(_conv_windows(x, self.conv1), self.bn1).relu_()
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in layer:
                x = block(x)
        return x


class AttentiveStatsPool(nn.Module):
    """Attention-weighted mean and standard deviation over time: ``[B, C, T] -> [B, 2C]``.

    The attention (``attention.0`` conv, ReLU, ``attention.2`` BN, ``attention.3`` conv, softmax over
    time) gives every row its own weights over frames.
    """

    def __init__(self, channels: int, attention_dim: int = 128) -> None:
        super().__init__()
        self.attention = nn.Sequential(
            nn.Conv1d(channels, attention_dim, kernel_size=1),
            nn.ReLU(),
            nn.BatchNorm1d(attention_dim),
            nn.Conv1d(attention_dim, channels, kernel_size=1),
            nn.Softmax(dim=2),
        )

    def forward(self, x: Tensor) -> Tensor:
        w = self.attention(x)
        mu = (x * w).sum(dim=2)
        # Clamp the variance: rounding can make E[x^2] - mu^2 slightly negative.
        sigma = ((x.square() * w).sum(dim=2) - mu.square()).clamp(min=1e-5).sqrt()
        return torch.cat([mu, sigma], dim=1)


class ResNetSimAMASP(nn.Module):
    """The speaker network: features ``[B, n_mels, T]`` -> raw embedding ``[B, embed_dim]``.

    ``state_dict()`` has exactly the keys of ``ResNet293_SimAM_ASP_base.pt`` for the default config.
    """

    def __init__(self, config: SpeakerNetConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or SpeakerNetConfig()
        self.front = ResNetTrunk(config.in_planes, config.num_blocks)
        self.pooling = AttentiveStatsPool(config.pooled_channels, config.attention_dim)
        self.bottleneck = nn.Linear(2 * config.pooled_channels, config.embed_dim)

    def forward(self, feats: Tensor) -> Tensor:
        x = self.front(feats.unsqueeze(1))  # mel bins are the image height, frames its width
        x = x.flatten(1, 2)  # [B, C * H, T']: row index = channel * H + mel row
        return self.bottleneck(self.pooling(x))
