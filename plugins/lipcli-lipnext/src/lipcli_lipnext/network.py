"""The ``lipnext`` architecture: normalisation, stem, ``depth`` LipNeXt blocks each followed by
β-Abs, L2 spatial pooling, the head (layout and the sources of each choice: README).

Body children (the guaranteed bound multiplies their bounds, SPEC §5):

============  ===============================================================  ==============
child         computes                                                         output
============  ===============================================================  ==============
normalize     ``(x − mean)/std`` (bound ``1/min std``)                         C_in @ S²
stem          patchify by ``patch``, semi-orthogonal ``C_in·patch² → width``     (S/p)² × width
block{i}      ``M·Rᵀ·S(R·(X + p_i)) + b_i`` (bound ``‖R‖²‖M‖`` as stored)        (S/p)² × width
block{i}_act  β-Abs (1-Lipschitz)                                              (S/p)² × width
pool          L2 spatial pooling (1-Lipschitz)                                 width
head          the ``--head`` component (LLN by default) on ``(N, width)``      classes
============  ===============================================================  ==============
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lipcli.sdk.specs import Component

from lipcli.sdk.inputs import Normalize

from .layers import BetaAbs, Block, L2Pool, Stem

#: largest depth and width (a model file is untrusted input: memory ~ depth·width²)
MAX_DEPTH = 256
MAX_WIDTH = 8192
MAX_PATCH = 32


class LipNeXt(nn.Module):
    """The architecture protocol of lipcli (``body``, ``head``, ``features``, ``forward``,
    ``refresh_power_iteration``)."""

    def __init__(self, *, conv: Component, activation: Component, pool: Component, head: Component,
                 num_classes: int, in_channels: int = 3, mean: Sequence[float] = (0.5,),
                 std: Sequence[float] = (1.0,), image_size: Sequence[int] = (32, 32), depth: int = 32,
                 width: int = 1024, patch: int = 2, beta: float = 0.5, shift_ratio: float = 0.125,
                 pool_eps: float = 1e-6) -> None:
        super().__init__()
        if not (1 <= depth <= MAX_DEPTH and 1 <= width <= MAX_WIDTH and 1 <= patch <= MAX_PATCH):
            raise ValueError(f"lipnext needs depth 1..{MAX_DEPTH}, width 1..{MAX_WIDTH}, patch 1..{MAX_PATCH}")
        if not (0 <= beta <= 1 and 0 <= shift_ratio <= 0.25 and pool_eps >= 0):
            raise ValueError("lipnext needs beta in [0, 1], shift_ratio in [0, 1/4], pool_eps >= 0")
        H, W = (int(image_size[0]), int(image_size[1]))
        if H % patch or W % patch:
            raise ValueError(f"lipnext: the image size {H}x{W} is not a multiple of patch={patch}")
        mean, std = tuple(mean), tuple(std)
        mean = mean * in_channels if len(mean) == 1 else mean
        std = std * in_channels if len(std) == 1 else std
        self.depth, self.width, self.num_classes, self.in_channels = depth, width, num_classes, in_channels
        self.image_size = (H, W)
        grid = (H // patch, W // patch)
        children: OrderedDict[str, nn.Module] = OrderedDict()
        children["normalize"] = Normalize(mean, std)
        children["stem"] = Stem(in_channels, width, patch)
        for i in range(1, depth + 1):
            children[f"block{i}"] = Block(width, grid, shift_ratio)
            children[f"block{i}_act"] = BetaAbs(width, beta)
        children["pool"] = L2Pool(pool_eps)
        self.body = nn.Sequential(children)
        self.feature_dim = width
        self.head = head.build(width, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Penultimate features ``(N, width)`` (normalisation included)."""
        if x.dim() != 4 or tuple(x.shape[1:]) != (self.in_channels, *self.image_size):
            raise ValueError(f"lipnext expects inputs (N, {self.in_channels}, {self.image_size[0]}, "
                             f"{self.image_size[1]}); got {tuple(x.shape)}")
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    @torch.no_grad()
    def refresh_power_iteration(self, steps: int = 50) -> None:
        """Nothing to refresh (no power iterations); the head's, if it has one."""
        refresh = getattr(self.head, "refresh", None)
        if callable(refresh):
            refresh(steps)

    def no_weight_decay_parameters(self) -> set[str]:
        """Positional encodings, biases and the orthogonal matrices (their norm is fixed)."""
        return {name for name, p in self.named_parameters() if not name.startswith("head.")}


def lipnext_factory(**kwargs: Any) -> LipNeXt:
    return LipNeXt(**kwargs)
