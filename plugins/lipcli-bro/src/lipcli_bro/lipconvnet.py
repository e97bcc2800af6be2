"""The BRONet authors' LipConvNet (``ntuaislab/BRONet``, ``lipconvnet/models/lip_convnets.py``
and ``lip_block.py``, commit 9d59c9bd15e8) as the architectures ``bronet-lipconvnet-<n>``.

It is not lipcli's ``lipconvnet-<n>`` (the paper's SOC network): every stride-2 layer is one
convolution ``C → 2C`` followed by the activation, with no channel pool.  Layout for depth
``n`` (``b = n/5`` convolutions per layer), width ``w``, an ``S × S`` input (``S`` a multiple
of 32; the authors' CIFAR is 32, Tiny ImageNet 64):

===========  ===============================================================  ============
stage        layers (body children, in order)                                 output
===========  ===============================================================  ============
normalise    ``normalize``: ``(x − mean)/std``                                3 @ S²
layer 1      ``layer1_conv1`` conv(3 → w, 3×3), … ``layer1_conv{b-1}``        w @ S²
             conv(w → w, 3×3), each with its ``layer1_act{j}``;
             ``layer1_conv{b}`` conv(C → 2w, 3×3, stride 2) + act             2w @ (S/2)²
             (``C`` = 3 when ``b = 1``, else ``w``)
layers 2-4   ``b − 1`` × conv(C → C, 3×3) + act, conv(C → 2C, 3×3, s 2)       16w @ (S/16)²
             + act, ``C`` = 2w, 4w, 8w
layer 5      ``b − 1`` × conv(16w → 16w, 3×3) + act, conv(16w → 32w, 1×1,    32w @ (S/32)²
             s 2) + act
features     ``flatten``                                                      32w·(S/32)²
head         the ``--head`` component (the authors': ``lln``)                 classes
===========  ===============================================================  ============

With ``--conv bro:rank_ratio=R,rank_rule=lipconvnet,border=zero,ridge=1e-5`` every convolution
is the authors' ``BRO`` layer (:mod:`lipcli_bro.border`).  Guaranteed bound:
``Lip(features) ≤ (1/min std) · Π U_conv`` (the activation, MaxMin, and the flatten are
1-Lipschitz), :func:`lipcli.lipschitz.bound.guaranteed_upper_bound` over the body.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from torch import nn

from lipcli.sdk.inputs import Normalize
from lipcli.sdk.specs import ONE_LIPSCHITZ, Component

from .network_base import AuthorsNetwork, check_arguments, per_channel

#: the authors' input normalisation (``lipconvnet/utils/__init__.py``, used for every data set)
AUTHORS_MEAN = (0.4914, 0.4822, 0.4465)
AUTHORS_STD = (0.2507, 0.2507, 0.2507)
#: depths registered as ``bronet-lipconvnet-<n>`` (the authors' ``--block-size`` 1 .. 8)
DEPTHS = tuple(range(5, 45, 5))
MAX_WIDTH = 256
TOTAL_STRIDE = 32


def layer_plan(blocks: int, width: int, in_channels: int = 3, kernel: int = 3) -> list[tuple[str, int, int, int, int]]:
    """``(name, in, out, kernel, stride)`` of every convolution, in order (module table); ``kernel``:
    the stride-2 layers' of layers 1-4 (the authors' ``--kernel``)."""
    plan, c = [], in_channels
    for layer in range(1, 6):
        planes = width if layer == 1 else c
        for j in range(1, blocks):
            plan.append((f"layer{layer}_conv{j}", c, planes, 3, 1))
            c = planes
        plan.append((f"layer{layer}_conv{blocks}", c, 2 * planes, kernel if layer < 5 else 1, 2))
        c = 2 * planes
    return plan


class BRONetLipConvNet(AuthorsNetwork):
    """The network of the module docstring (lipcli's architecture protocol: ``body``,
    ``head``, ``features``, ``forward``)."""

    network_name = "the BRONet LipConvNet"

    def __init__(self, *, depth: int, conv: Component, activation: Component, pool: Component,
                 head: Component, num_classes: int, in_channels: int = 3,
                 mean: Sequence[float] = AUTHORS_MEAN, std: Sequence[float] = AUTHORS_STD,
                 width: int = 32, image_size: Sequence[int] = (32, 32), kernel: int = 3) -> None:
        super().__init__()
        del pool  # the authors' LipConvNet downsamples with the stride-2 convolutions only
        size = (int(image_size[0]), int(image_size[1]))
        if size[0] != size[1] or size[0] % TOTAL_STRIDE or size[0] < TOTAL_STRIDE:
            raise ValueError(f"the BRONet LipConvNet needs a square image whose side is a multiple of "
                             f"{TOTAL_STRIDE}, got {size[0]}x{size[1]}")
        mean, std = per_channel(mean, in_channels), per_channel(std, in_channels)
        check_arguments(((depth % 5 == 0 and 5 <= depth <= DEPTHS[-1],
                          f"depth must be a multiple of 5 in 5..{DEPTHS[-1]}, got {depth}"),
                         (1 <= width <= MAX_WIDTH, f"width must be in 1..{MAX_WIDTH}, got {width}"),
                         (kernel % 2 == 1 and 1 <= kernel <= 7, f"kernel must be odd in 1..7, got {kernel}"),
                         (num_classes >= 2, f"num_classes must be at least 2, got {num_classes}"),
                         (len(mean) == len(std) == in_channels,
                          f"mean/std need {in_channels} entries, got {len(mean)} and {len(std)}")))
        self.depth, self.width, self.num_classes = depth, width, num_classes
        self.in_channels, self.image_size = in_channels, size
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        layers["normalize"] = Normalize(mean, std)
        for name, c_in, c_out, k, s in layer_plan(depth // 5, width, in_channels, kernel):
            layers[name] = conv.build(c_in, c_out, k, s)
            layers[name.replace("_conv", "_act")] = activation.build(c_out)
        layers["flatten"] = flatten = nn.Flatten(1)
        flatten.lip_promises = (ONE_LIPSCHITZ,)  # a reshape
        self.body = nn.Sequential(layers)
        self.feature_dim = 32 * width * (size[0] // TOTAL_STRIDE) ** 2
        self.head = head.build(self.feature_dim, num_classes)
