"""The LOT authors' networks (``AI-secure/Layerwise-Orthogonal-Training``, ``lip_convnets.py``,
commit 65f7ea4) as the architectures ``lot-lipconvnet-<n>`` (``LipConvNet``) and
``lot-lipresnet-<n>`` (``LipResNet``, ``train_robust.py --residual``).

Both have five layers of ``b = n/5`` blocks (convolution + activation); the last block of
every layer is a stride-2 convolution ``C → 2C`` (3×3; 1×1 in layer 5), with no channel pool.
Width ``w`` (the authors' ``--init-channels``), an ``S × S`` input (``S`` a multiple of 32):

==========  =====================================================================  ==========
stage       body children, in order                                                output
==========  =====================================================================  ==========
normalise   ``normalize``: ``(x − mean)/std``                                      3 @ S²
layer 1     ``layer1_conv1`` conv(3 → w, 3×3) + ``layer1_act1``, blocks            w @ S²
            ``2 .. b−1`` conv(w → w, 3×3) + act, ``layer1_conv{b}``
            conv(C → 2w, 3×3, stride 2) + act (``C`` = 3 when ``b = 1``, else w)    2w @ (S/2)²
layers 2-5  the same from ``C`` = 2w, 4w, 8w, 16w channels (layer 5: the strided   32w @ (S/32)²
            convolution is 1×1)
features    ``flatten``                                                            32w·(S/32)²
head        the ``--head`` component (the authors': ``lln``, or ``lot``: their     classes
            1×1 LOT layer on the features)
==========  =====================================================================  ==========

``lot-lipresnet-<n>`` replaces every middle block ``j = 2 .. b−1`` by the authors' convex
combination ``x ← λ·x + (1 − λ)·block(x)`` (``ResLayer``; ``λ = sigmoid(res_lamda_logit)``,
their fixed ``0.5``: the parameter ``mix``) as ``layer{i}_res{j}``, lipcli's
:class:`~lipcli.sdk.residual.ConvexResidual` (guaranteed bound
``a + c·Π U`` of its two layers).  With ``b ≤ 2`` it is ``lot-lipconvnet-<n>``.

With ``--conv lot:border=zero`` every convolution is the authors' LOT layer
(:mod:`lipcli_lot.lot`).  Guaranteed bound: ``(1/min std) · Π U_child`` over the body's
children (the activation and the flatten are 1-Lipschitz), as every lipcli network.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from torch import Tensor, nn

from lipcli.sdk.residual import AUTHORS_MIX, ConvexResidual
from lipcli.sdk.inputs import Normalize
from lipcli.sdk.specs import ONE_LIPSCHITZ, Component

#: the authors' input normalisation (``utils.py``: CIFAR-10's mean, std 0.2507, every data set)
LOT_MEAN = (0.4914, 0.4822, 0.4465)
LOT_STD = (0.2507, 0.2507, 0.2507)
#: ``--block-size`` 1 .. 8 of ``train_robust.py``
DEPTHS = tuple(5 * b for b in range(1, 9))
MAX_WIDTH = 256
STRIDE = 32


def lot_blocks(blocks: int, width: int, in_channels: int = 3) -> Iterator[tuple[int, int, int, int, int, int]]:
    """``(layer, block, in, out, kernel, stride)`` of every block (1-based), in order."""
    channels = in_channels
    for layer in range(1, 6):
        planes = width if layer == 1 else channels
        for block in range(1, blocks + 1):
            last = block == blocks
            kernel = 1 if last and layer == 5 else 3
            out = 2 * planes if last else planes
            yield layer, block, channels, out, kernel, 2 if last else 1
            channels = out


class LOTLipConvNet(nn.Module):
    """The network of the module docstring (lipcli's architecture protocol: ``body``,
    ``head``, ``features``, ``forward``); ``mix`` ``None``: no residuals."""

    def __init__(self, *, depth: int, conv: Component, activation: Component, pool: Component,
                 head: Component, num_classes: int, in_channels: int = 3,
                 mean: Sequence[float] = LOT_MEAN, std: Sequence[float] = LOT_STD, width: int = 32,
                 image_size: Sequence[int] = (32, 32), mix: float | None = None) -> None:
        super().__init__()
        del pool  # the authors' networks downsample with their stride-2 convolutions only
        side = int(image_size[0])
        mean = tuple(mean) * (in_channels if len(tuple(mean)) == 1 else 1)
        std = tuple(std) * (in_channels if len(tuple(std)) == 1 else 1)
        problems = [
            (int(image_size[1]) == side and side % STRIDE == 0 and side >= STRIDE,
             f"the LOT networks need a square image whose side is a multiple of {STRIDE}, got "
             f"{image_size[0]}x{image_size[1]}"),
            (depth in DEPTHS, f"depth must be one of {', '.join(map(str, DEPTHS))}, got {depth}"),
            (1 <= width <= MAX_WIDTH, f"width must be in 1..{MAX_WIDTH}, got {width}"),
            (num_classes >= 2, f"num_classes must be at least 2, got {num_classes}"),
            (len(mean) == len(std) == in_channels, f"mean/std need {in_channels} entries"),
            (mix is None or 0.0 <= float(mix) <= 1.0, f"mix must be in [0, 1], got {mix}"),
        ]
        for ok, message in problems:
            if not ok:
                raise ValueError(message)
        self.depth, self.width, self.num_classes, self.mix = depth, width, num_classes, mix
        self.in_channels, self.image_size = in_channels, (side, side)
        blocks = depth // 5
        body: OrderedDict[str, nn.Module] = OrderedDict(normalize=Normalize(mean, std))
        for layer, block, c_in, c_out, k, s in lot_blocks(blocks, width, in_channels):
            pair = OrderedDict([(f"layer{layer}_conv{block}", conv.build(c_in, c_out, k, s)),
                                (f"layer{layer}_act{block}", activation.build(c_out))])
            if mix is not None and 1 < block < blocks:
                body[f"layer{layer}_res{block}"] = ConvexResidual(nn.Sequential(pair), float(mix))
            else:
                body.update(pair)
        body["flatten"] = flatten = nn.Flatten(1)
        flatten.lip_promises = (ONE_LIPSCHITZ,)  # a reshape
        self.body = nn.Sequential(body)
        self.feature_dim = 32 * width * (side // STRIDE) ** 2
        self.head = head.build(self.feature_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Penultimate features ``(N, D)`` (normalisation included) of ``(N, in, S, S)`` inputs."""
        want = (self.in_channels, *self.image_size)
        if x.dim() == 4 and tuple(x.shape[1:]) == want:
            return self.body(x)
        raise ValueError(f"the LOT network expects inputs (N, {', '.join(map(str, want))}); got {tuple(x.shape)}")

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def lot_lipresnet(*, mix: float = AUTHORS_MIX, **kwargs: object) -> LOTLipConvNet:
    """``lot-lipresnet-<n>``: :class:`LOTLipConvNet` with the convex-combination residuals."""
    return LOTLipConvNet(mix=float(mix), **kwargs)  # type: ignore[arg-type]
