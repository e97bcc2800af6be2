"""The comparison study's network (``berndprach/1LipschitzLayersCompared``, commit 01e3f2a,
``models/simplified_conv_net.py``: ``SimplifiedConvNet``, sizes ``DEFAULT_MODELS``;
``models/model_layer_combinations.py``: ``get_model``) as the architectures ``convnet-xs``,
``convnet-s``, ``convnet-m`` and ``convnet-l`` (the study's ConvNetXS .. ConvNetL: width
``w`` = 16, 32, 64, 128), built with the ``--conv`` component.

Layout for an ``S × S`` input (``S = 2^B``; the study's CIFAR runs: ``S = 32``, ``B = 5``),
body children in order:

=================  ==========================================================  ==============
stage              layers                                                      output
=================  ==========================================================  ==============
``normalize``      ``x − mean`` (``center``, the study's; else ``·1/std``)      in @ S²
``pad``            zero channels up to ``w`` (``ZeroChannelConcatenation``)    w @ S²
``conv0, act0``    the method's 1×1 convolution ``w → w`` and the activation   w @ S²
block ``i``        ``layers`` × [conv ``c → c`` (k×k; 1×1 in the last block)   2c @ (S/2^i)²
(i = 1..B)         + activation] (``b{i}c{j}``, ``b{i}a{j}``), ``b{i}keep``:
                   the first ``c/2`` channels, ``b{i}shuffle``: pixel
                   unshuffle (c = w·2^(i−1))
``dense``          the method's dense layer ``2^B·w → 2^B·w``: its 1×1         2^B·w @ 1²
                   convolution on the 1×1 image (the study's choice for every
                   method but Cayley, BCOP and Sandwich, whose dense layers
                   are the same maps: an orthogonal matrix, a Sandwich
                   layer on one frequency)
``flatten``        ``(N, 2^B·w)``                                              2^B·w
head               ``--head first-channels``: the first ``num_classes``        classes
=================  ==========================================================  ==============

(The study's ``AdaptiveMaxPool2d(1)`` before the dense layer acts on a 1×1 image: the
identity, left out.)  No skip connections, no normalisation layers.  Guaranteed bound: the
product of the layers' bounds (``max 1/std``, the convolutions' own, 1 for the activation,
the zero padding, the channel selection and the pixel unshuffle, all norm ≤ 1).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.sdk.specs import ONE_LIPSCHITZ, Component
from lipcli.sdk.inputs import Normalize

__all__ = ["SIZES", "ComparedConvNet", "FirstChannels", "ZeroChannels"]

#: the study's sizes: name -> base width (5 convolutions per block, 3×3 kernels)
SIZES = {"xs": 16, "s": 32, "m": 64, "l": 128}
LAYERS_PER_BLOCK, KERNEL = 5, 3
MAX_WIDTH, MAX_LAYERS = 1024, 64


class ZeroChannels(nn.Module):
    """Zero channels appended up to ``channels`` (an isometric embedding)."""

    lip_promises = (ONE_LIPSCHITZ,)

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = int(channels)

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x, (0, 0, 0, 0, 0, max(0, self.channels - x.shape[1])))

    def export_module(self) -> nn.Module:
        return self


class FirstChannels(nn.Module):
    """The first ``channels`` channels (or features): a coordinate projection."""

    lip_promises = (ONE_LIPSCHITZ,)

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = int(channels)

    def forward(self, x: Tensor) -> Tensor:
        return x[:, : self.channels]

    def lipschitz_upper_bound(self) -> float:
        return 1.0

    def export_module(self) -> nn.Module:
        return self


class _Unshuffle(nn.PixelUnshuffle):
    lip_promises = (ONE_LIPSCHITZ,)

    def export_module(self) -> nn.Module:
        return self


def first_channels_head(in_features: int, num_classes: int) -> FirstChannels:
    """HeadSpec factory: the study's head, the first ``num_classes`` features as logits."""
    if num_classes > in_features:
        raise ValueError(f"first-channels needs at least {num_classes} features, got {in_features}")
    return FirstChannels(num_classes)


class ComparedConvNet(nn.Module):
    """The network of the module docstring (lipcli's architecture protocol)."""

    def __init__(self, *, conv: Component, activation: Component, pool: Component, head: Component,
                 num_classes: int, in_channels: int = 3, mean: Sequence[float] = (0.0,),
                 std: Sequence[float] = (1.0,), image_size: Sequence[int] = (32, 32),
                 width: int = 16, layers: int = LAYERS_PER_BLOCK, kernel: int = KERNEL,
                 center: bool = True) -> None:
        super().__init__()
        del pool  # the blocks halve channels by keeping the first half, as the study
        size = (int(image_size[0]), int(image_size[1]))
        if size[0] != size[1] or size[0] < 2 or size[0] & (size[0] - 1):
            raise ValueError(f"the study's network needs square images of a power-of-2 size, got {size[0]}x{size[1]}")
        if not 1 <= width <= MAX_WIDTH or not 1 <= layers <= MAX_LAYERS:
            raise ValueError(f"width must be in 1..{MAX_WIDTH} and layers in 1..{MAX_LAYERS}")
        if width < in_channels:
            raise ValueError(f"width {width} is below the {in_channels} input channels")
        mean, std = tuple(mean), tuple(std)
        mean = mean * in_channels if len(mean) == 1 else mean
        std = std * in_channels if len(std) == 1 else std
        if center:  # the study: subtract the means, std 1 (settings/datasets.yml)
            std = (1.0,) * in_channels
        blocks = int(math.log2(size[0]))
        self.width, self.layers, self.blocks, self.kernel = int(width), int(layers), blocks, int(kernel)
        self.num_classes, self.in_channels, self.image_size = int(num_classes), int(in_channels), size
        body: OrderedDict[str, nn.Module] = OrderedDict()
        body["normalize"] = Normalize(mean, std)  # the SDK's: (x - mean)/std, bound 1/min(std)
        body["pad"] = ZeroChannels(width)
        body["conv0"] = conv.build(width, width, 1, 1)
        body["act0"] = activation.build(width)
        c = width
        for i in range(1, blocks + 1):
            k = self.kernel if i < blocks else 1  # the study: 2x2 images get 1x1 kernels
            for j in range(1, layers + 1):
                body[f"b{i}c{j}"] = conv.build(c, c, k, 1)
                body[f"b{i}a{j}"] = activation.build(c)
            body[f"b{i}keep"] = FirstChannels(c // 2)
            body[f"b{i}shuffle"] = _Unshuffle(2)
            c *= 2
        body["dense"] = conv.build(c, c, 1, 1)
        body["flatten"] = flatten = nn.Flatten(1)
        flatten.lip_promises = (ONE_LIPSCHITZ,)
        self.body = nn.Sequential(body)
        self.feature_dim = c
        self.head = head.build(c, num_classes)

    @torch.no_grad()
    def refresh_power_iteration(self, steps: int = 50) -> None:
        for refresh in (getattr(m, "refresh", None) for m in self.modules() if m is not self):
            if callable(refresh):
                refresh(steps)

    def features(self, x: Tensor) -> Tensor:
        expected = (self.in_channels, *self.image_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"the study's network expects inputs (N, {', '.join(map(str, expected))}); "
                             f"got {tuple(x.shape)}")
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))
