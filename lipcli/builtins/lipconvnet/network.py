"""LipConvnet-n (SPEC §3, paper Tables 4-5), assembled from plugin components.

Layout for depth ``n`` (a multiple of 5), ``b = n/5`` convolutions per block, width ``w``
(32 in the paper), input ``3 x 32 x 32``; "conv" is whatever convolution component is chosen
(SOC in the paper), "act" the activation (MaxMin) and "pool" the channel-halving pool:

==========  ================================================================  ===============
stage       layers                                                            output (w=32)
==========  ================================================================  ===============
normalise   ``(x - mean) / std``                                              3 @ 32²
stem        conv(3 -> w, k3, s1) + act                                        32 @ 32²
block 1-4   (b-1) x [conv(C -> C, k3, s1) + act], conv(C -> 4C, k3, s2)       64 @ 16² ...
            + pool(4C -> 2C), with C = w, 2w, 4w, 8w                          ... 512 @ 2²
block 5     conv(16w -> 64w, k1, s2), (b-1) x conv(64w -> 64w, k1, s1),       1024 @ 1²
            act after each but the last; the last is followed by pool         (pool) or
            (head features ``"pool"``) or act (``"activation"``)              2048 @ 1²
flatten     ``(N, D)`` features, D = 32w (pool) or 64w (activation)           1024 / 2048
head        the head component on ``(N, D)``                                  num_classes
==========  ================================================================  ===============

A stride-2 convolution maps ``(C, H, W)`` to ``(C_out, H/2, W/2)`` (SOC rearranges with
``pixel_unshuffle`` first).  Larger inputs: square images of ``S = 32 · 2^k`` pixels (64 for
TinyImageNet, 128, ...) get ``k`` more 3×3 blocks, so that every stride-2 block halves the
image down to ``1 x 1`` as in the table above: blocks ``1 .. 4 + k`` are 3×3 blocks (channels
``w, 2w, ... `` doubling per block) and block ``5 + k`` is the 1×1 block, on ``2^(4+k) w``
channels; ``D = 2^(5+k) w`` (pool) or ``2^(6+k) w`` (activation).  A depth-``n`` network then
has ``(5 + k) · n/5 + 1`` convolutions.  For 32 × 32 (``k = 0``) nothing changes, layer
names included.  The input size is the factory's ``image_size`` (the model config's
``image_size``); the head is sized for it, the only size the flattened features fit.

Lipschitz constant (SPEC §5): ``Lip(features) <= (1/min std) * prod Lip(child)`` over the
children of :attr:`LipConvnet.body`, with ``Lip = 1`` for every child whose
``lip_promises`` contain ``"1-lipschitz"``; see :meth:`LipConvnet.lipschitz_upper_bound`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
import torch
from torch import nn

from lipcli._util.constants import CIFAR_MEAN, CIFAR_STD  # the default input normalisation
from lipcli.sdk.inputs import Normalize, doublings  # Normalize: also this module's name for it
from lipcli.sdk.weight_decay import no_weight_decay_names
from lipcli.sdk.specs import ONE_LIPSCHITZ, Component
from lipcli.host.models import ComponentParameterError
from lipcli.lipschitz.bound import guaranteed_upper_bound

#: depths registered as ``lipconvnet-<n>``
DEPTHS: tuple[int, ...] = tuple(range(5, 45, 5))

#: total stride of the network at the paper's input size (five stride-2 convolutions)
TOTAL_STRIDE = 32


def extra_blocks(image_size: Sequence[int]) -> int:
    """``k`` for a square ``32 · 2^k`` input; ``ValueError`` for any other size."""
    return doublings(image_size, TOTAL_STRIDE, "LipConvnet")


@dataclass(frozen=True)
class _LayerPlan:
    """How one body child changes the shape: new channel count (None: keep) and stride."""

    name: str
    out_channels: int | None = None
    stride: int = 1
    flatten: bool = False


def _check_arguments(
    depth: int,
    head: Component,
    num_classes: int,
    in_channels: int,
    mean: Sequence[float],
    std: Sequence[float],
    width: int,
    image_size: Sequence[int],
) -> tuple[int, tuple[float, ...], tuple[float, ...], str]:
    """Validate :class:`LipConvnet`'s arguments; returns ``(extra blocks, mean, std, head
    features)`` with one-entry ``mean``/``std`` repeated for every input channel."""
    try:
        k = extra_blocks(image_size)
    except ValueError as exc:  # the input size, not a parameter: say so, not "rejected width=..."

        raise ComponentParameterError("arch", f"lipconvnet-{depth}", {}, str(exc)) from None
    if depth < 5 or depth % 5:
        raise ValueError(f"LipConvnet depth must be a positive multiple of 5, got {depth}")
    if width < 1:
        raise ValueError(f"width must be positive, got {width}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}")
    mean, std = tuple(mean), tuple(std)
    if len(mean) == 1:
        mean = mean * in_channels
    if len(std) == 1:
        std = std * in_channels
    if len(mean) != in_channels or len(std) != in_channels:
        raise ValueError(
            f"mean/std need {in_channels} entries (one per input channel), "
            f"got {len(mean)} and {len(std)}"
        )
    head_features = getattr(head.spec, "features", "pool")
    if head_features not in ("pool", "activation"):
        raise ValueError(f"head {head.name!r}: unknown features {head_features!r}")
    return k, mean, std, head_features


class _BodyBuilder:
    """Collects the body's named layers (built by the components, in order) and their plan.

    Each layer carries its component's promises (``lip_promises``) and names the component
    (``lip_component``): :meth:`~lipcli.sdk.specs.Component.build` stamps both."""

    def __init__(self, conv: Component, activation: Component, pool: Component) -> None:
        self.conv, self.activation, self.pool = conv, activation, pool
        self.layers: OrderedDict[str, nn.Module] = OrderedDict()
        self.plan: list[_LayerPlan] = []

    def add_conv(self, name: str, c_in: int, c_out: int, k: int, s: int) -> None:
        self.layers[name] = self.conv.build(c_in, c_out, k, s)
        self.plan.append(_LayerPlan(name, c_out, s))

    def add_act(self, name: str, channels: int) -> None:
        self.layers[name] = self.activation.build(channels)
        self.plan.append(_LayerPlan(name))

    def add_pool(self, name: str, channels: int) -> None:
        self.layers[name] = self.pool.build(channels)
        self.plan.append(_LayerPlan(name, channels // 2))

    def add_blocks(self, in_channels: int, width: int, per_block: int, last: int, head_features: str) -> int:
        """The stem, blocks ``1 .. last-1`` and the 1x1 block ``last``; returns the channels."""
        self.add_conv("stem_conv", in_channels, width, 3, 1)
        self.add_act("stem_act", width)
        channels = width
        for block in range(1, last):
            for i in range(1, per_block):
                self.add_conv(f"block{block}_conv{i}", channels, channels, 3, 1)
                self.add_act(f"block{block}_act{i}", channels)
            self.add_conv(f"block{block}_down", channels, 4 * channels, 3, 2)
            self.add_pool(f"block{block}_pool", 4 * channels)
            channels *= 2
        # the 1x1 block (block 5 at 32 x 32): channels == 2^(4+k) w here
        self.add_conv(f"block{last}_down", channels, 4 * channels, 1, 2)
        channels *= 4
        for i in range(1, per_block):
            self.add_act(f"block{last}_act{i}", channels)
            self.add_conv(f"block{last}_conv{i}", channels, channels, 1, 1)
        if head_features == "pool":
            self.add_pool(f"block{last}_pool", channels)
            channels //= 2
        else:
            self.add_act(f"block{last}_act", channels)
        return channels


class LipConvnet(nn.Module):
    """LipConvnet-``depth`` built from conv / activation / pool / head components (SPEC §3).

    Attributes: ``body`` (``nn.Sequential``: :class:`Normalize`, the layers, ``nn.Flatten``),
    ``head``, ``depth``, ``width``, ``num_classes``, ``feature_dim`` (D), ``head_features``
    (``"pool"`` or ``"activation"``).
    """

    def __init__(
        self,
        *,
        depth: int,
        conv: Component,
        activation: Component,
        pool: Component,
        head: Component,
        num_classes: int,
        in_channels: int = 3,
        mean: Sequence[float] = CIFAR_MEAN,
        std: Sequence[float] = CIFAR_STD,
        width: int = 32,
        image_size: Sequence[int] = (TOTAL_STRIDE, TOTAL_STRIDE),
    ) -> None:
        super().__init__()
        k, mean, std, head_features = _check_arguments(
            depth, head, num_classes, in_channels, mean, std, width, image_size
        )
        self.depth = depth
        self.width = width
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.head_features = head_features
        self.image_size = (int(image_size[0]), int(image_size[1]))

        body = _BodyBuilder(conv, activation, pool)
        body.layers["normalize"] = Normalize(mean, std)
        body.plan.append(_LayerPlan("normalize"))
        channels = body.add_blocks(in_channels, width, depth // 5, 5 + k, head_features)
        body.layers["flatten"] = flatten = nn.Flatten(1)
        flatten.lip_promises = (ONE_LIPSCHITZ,)  # a reshape, not a component: promised here
        body.plan.append(_LayerPlan("flatten", flatten=True))

        self.body = nn.Sequential(body.layers)
        self._plan: tuple[_LayerPlan, ...] = tuple(body.plan)
        #: D, the feature dimension for an ``image_size`` input (spatial 1 x 1 after the last block)
        self.feature_dim = channels
        self.head = head.build(self.feature_dim, num_classes)

    # -- the module protocol ------------------------------------------------------------------
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features ``y = g(x)`` of shape ``(N, D)`` (normalisation included)."""
        y = self.body(x) if tuple(x.shape[-2:]) == self.image_size else None
        if y is None or y.shape[1] != self.feature_dim:
            raise ValueError(
                f"LipConvnet expects inputs (N, {self.in_channels}, {self.image_size[0]}, "
                f"{self.image_size[1]}); got "
                f"{tuple(x.shape)}" + ("" if y is None else
                                       f", giving {y.shape[1]} features instead of {self.feature_dim}")
            )
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    @torch.no_grad()
    def refresh_power_iteration(self, steps: int = 50) -> None:
        """Call ``refresh(steps)`` on every submodule that has power-iteration state."""
        for module in self.modules():
            if module is self:
                continue
            refresh = getattr(module, "refresh", None)
            if callable(refresh):
                refresh(steps)

    # -- tooling ------------------------------------------------------------------------------
    def lipschitz_upper_bound(self) -> float:
        """Guaranteed bound on ``Lip(features)`` (SPEC §5): :func:`lipcli.lipschitz.bound.guaranteed_upper_bound`
        (product of per-layer bounds, 1 for ``"1-lipschitz"`` layers, rounded up)."""

        return guaranteed_upper_bound(self)[0]

    def no_weight_decay_parameters(self) -> set[str]:
        """Full names of parameters excluded from weight decay (submodules' ``no_weight_decay``)."""
        return no_weight_decay_names(self)

    def describe(
        self, input_shape: tuple[int, int, int] | None = None
    ) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
        """``(layer name, input shape, output shape)`` per body child and the head (no batch dim).

        Computed from the layout, without running the network. Default input
        ``(in_channels, *image_size)``.
        """
        shape: tuple[int, ...] = input_shape or (self.in_channels, *self.image_size)
        if len(shape) != 3:
            raise ValueError(f"input_shape must be (C, H, W), got {shape}")
        rows: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
        for step in self._plan:
            if step.flatten:
                out: tuple[int, ...] = (math.prod(shape),)
            else:
                c, h, w = shape
                if h % step.stride or w % step.stride:
                    raise ValueError(
                        f"layer {step.name!r}: spatial size {h}x{w} not divisible by stride "
                        f"{step.stride}; inputs must be multiples of {TOTAL_STRIDE}"
                    )
                out = (
                    step.out_channels if step.out_channels is not None else c,
                    h // step.stride,
                    w // step.stride,
                )
            rows.append((step.name, shape, out))
            shape = out
        rows.append(("head", shape, (self.num_classes,)))
        return rows
