"""LiResNet (Hu et al., NeurIPS 2023) / BRONet-shaped (Lai et al., ICLR 2025) networks from
lipcli components: a stem, a constant-width backbone, a neck to a vector, dense layers and
the head.

Layout for an ``S = 32·2^k`` square input, width ``w``, ``depth`` backbone blocks, ``dense``
dense layers, ``D = 16 w``; "conv" is the ``--conv`` component, "act" the ``--activation``
(MaxMin), "pool" the ``--pool``:

==============  ===========================================================  ==============
stage           layers (body children, in order)                             output
==============  ===========================================================  ==============
normalise       ``normalize``: ``(x − mean) / std``                          in @ S²
stem            ``stem_conv`` conv(in → w, 3×3, stride 2) + ``stem_act``;    w @ 16²
                then k × [``stem_down{j}`` conv(w → w, 3×3, stride 2) + act]
backbone        ``depth`` × block + ``block{i}_act``; block ``residual``:    w @ 16²
                ``block{i}_res`` = x + W ∗ x + b (LiResNet, free 3×3 W);
                block ``conv``: ``block{i}_conv`` = conv(w → w, 3×3)
neck            ``neck_down1..2`` conv(w → w, 3×3, stride 2) (16 → 4), then  D @ 1²
                ``to_vector`` (reshape to ``(N, D, 1, 1)``)
dense           ``dense`` × [``dense{j}`` conv(D → D, 1×1) on 1×1 images:    D @ 1²
                a dense layer] with act after each but the last
features        ``features_pool`` pool (head features ``"pool"``: D/2) or    D/2 or D
                ``features_act`` act (``"activation"``, the CRC-Lip MLP);
                ``flatten``
head            the ``--head`` component on ``(N, D/2)`` or ``(N, D)``       classes
==============  ===========================================================  ==============

Options (``--arch liresnet:...``; the defaults give the layout above):

* ``gamma``, ``depth_scale``, ``centering``: the authors' residual block options
  (:class:`~lipcli_liresnet.residual.ResidualConv`: per-channel ``γ``, the factor
  ``depth^-1/2``, batch centring of the branch);
* ``stem_kernel``: the stem convolution's kernel (the authors': 5);
* ``neck``: ``conv`` (above) or ``patch``, the authors' neck: a 4×4 stride-4 patch
  convolution ``w → w`` (16 → 4) as ``neck_patch`` (``pixel_unshuffle`` by 4, a
  permutation) + ``neck_conv`` conv(16w → w, 1×1), ``to_vector``, then ``neck_dense``
  conv(16w → D, 1×1) + ``neck_act``;
* ``dense_width``: ``D`` (0: ``16·w``; the authors': 2048); with ``neck=conv`` the first
  dense layer maps ``16w → D``;
* ``features``: ``head`` (above: what the head asks for) or ``act``, the authors' dense
  stack: the activation after every dense layer (``features_act`` after the last) and the
  head on all ``D`` features.
* ``layers``: ``conv`` (above: the stem, neck and dense layers are the ``--conv``
  component), ``free``: each of them is a :class:`~lipcli_liresnet.free_conv.FreeConv`, a free
  filter (the ``stem_kernel``×``stem_kernel`` stem is then the exact stride-2 convolution with
  zero padding) with a proven bound on its norm; what ``lip import --from liresnet`` builds
  (the authors' stem convolution and their Cholesky-orthogonalised matrices as computed); or
  ``cholesky`` (with ``neck=patch``), the layer types the authors train: the stem convolutions
  are :class:`~lipcli_liresnet.free_conv.FreeConv` (counted in training by the authors' power
  iteration, 10 steps per step), the neck is ``neck_conv``, a
  :class:`~lipcli_liresnet.cholesky.CholeskyPatchConv` (their ``Map2Vec`` kernel), ``neck_flatten``
  and ``neck_dense``, a :class:`~lipcli_liresnet.cholesky.CholeskyLinear` ``16w → D`` with bias, and
  each dense layer is a quasi-residual :class:`~lipcli_liresnet.cholesky.CholeskyLinear`
  (``X = I + (W ⊙ γ)·dense^-1/2``, their ``LiResMLP``), on ``(N, D)`` vectors; ``to_vector``
  then gives the features stage its ``(N, D, 1, 1)`` input.

Guaranteed bound (SPEC §5): ``Lip(features) ≤ Π_children U_child`` with ``U = 1/min std``
for the normalisation, the residual block's proven ``‖I + W‖₂`` bound
(:class:`~lipcli_liresnet.residual.ResidualConv`), the component's own
``lipschitz_upper_bound()`` where it has one (SOC), and 1 for every child that promises
``"1-lipschitz"`` (the other convolutions, MaxMin, pools, reshapes).  lipcli's host multiplies
them (rounded up) for ``lip certify``, ``lip lipschitz`` and ``lip export --certify``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .cholesky import CholeskyLinear, CholeskyPatchConv
from .free_conv import FreeConv
from lipcli.sdk.inputs import doublings
from lipcli.sdk.weight_decay import no_weight_decay_names
from lipcli.sdk.specs import ONE_LIPSCHITZ, Component

from .residual import ResidualConv

#: inputs are 32·2^k pixels square
INPUT_BASE = 32
#: the backbone's spatial size (the stem brings every 32·2^k input down to it, as the
#: authors' stride-2 stem does for CIFAR: 32 → 16)
BACKBONE_SIZE = 16
#: stride-2 convolutions of the neck (16 → 4)
NECK_DOWNS = 2
BLOCKS = ("residual", "conv")
STEM_KERNELS = (3, 5)
NECKS = ("conv", "patch")
FEATURES = ("head", "act")
#: ``conv``: the stem, neck and dense layers are the ``--conv`` component; ``free``: free
#: filters with a proven bound (:class:`~lipcli_liresnet.free_conv.FreeConv`, imported models);
#: ``cholesky``: the authors' trained layer types (free stem, Cholesky neck and dense layers)
LAYERS = ("conv", "free", "cholesky")
#: the ``patch`` neck's stride (the authors' 4×4 stride-4 convolution)
PATCH = 4
MAX_DEPTH, MAX_WIDTH, MAX_DENSE = 256, 4096, 64


def extra_downs(image_size: Sequence[int]) -> int:
    """``k`` for a square ``32·2^k`` input; ``ValueError`` for any other size."""
    return doublings(image_size, INPUT_BASE, "liresnet")


class Normalize(nn.Module):
    """``(x − mean) / std`` per channel; Lipschitz ``1 / min std`` (exact)."""

    lip_promises: tuple[str, ...] = ()

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(tuple(mean), dtype=torch.float32))
        self.register_buffer("std", torch.tensor(tuple(std), dtype=torch.float32))
        if not bool((self.std > 0).all()):
            raise ValueError(f"std must be positive, got {tuple(std)}")

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean.to(x.dtype).view(1, -1, 1, 1)) / self.std.to(x.dtype).view(1, -1, 1, 1)

    def lipschitz_upper_bound(self) -> float:
        return 1.0 / float(self.std.double().min())

    def export_module(self) -> nn.Module:
        return self


class ToVector(nn.Module):
    """``(N, C, H, W) → (N, C·H·W, 1, 1)``: a reshape (an isometry)."""

    lip_promises = (ONE_LIPSCHITZ,)

    def forward(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], -1, 1, 1)

    def export_module(self) -> nn.Module:
        return self


class PatchRearrange(nn.Module):
    """``pixel_unshuffle(x, 4)``: a permutation of the coordinates (norm 1)."""

    lip_promises = (ONE_LIPSCHITZ,)

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.pixel_unshuffle(x, PATCH)

    def export_module(self) -> nn.Module:
        return self


class Flatten(nn.Flatten):
    lip_promises = (ONE_LIPSCHITZ,)

    def __init__(self) -> None:
        super().__init__(1)

    def export_module(self) -> nn.Module:
        return self


def _check_shape(*, depth: int, width: int, dense: int, block: str, stem_kernel: int, neck: str,
                 features: str, dense_width: int, num_classes: int, layers: str = "conv") -> None:
    """Refuse a shape parameter out of its range (one clear message)."""
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth must be in 1..{MAX_DEPTH}, got {depth}")
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width must be in 1..{MAX_WIDTH}, got {width}")
    if not 0 <= dense <= MAX_DENSE:
        raise ValueError(f"dense must be in 0..{MAX_DENSE}, got {dense}")
    if block not in BLOCKS:
        raise ValueError(f"block must be one of {', '.join(BLOCKS)}, got {block!r}")
    if stem_kernel not in STEM_KERNELS or neck not in NECKS or features not in FEATURES:
        raise ValueError(f"stem_kernel must be one of {STEM_KERNELS}, neck one of {', '.join(NECKS)}, "
                         f"features one of {', '.join(FEATURES)}; got {stem_kernel}, {neck!r}, {features!r}")
    if not 0 <= dense_width <= MAX_WIDTH * 16:
        raise ValueError(f"dense_width must be in 0..{MAX_WIDTH * 16}, got {dense_width}")
    if layers not in LAYERS:
        raise ValueError(f"layers must be one of {', '.join(LAYERS)}, got {layers!r}")
    if layers == "cholesky" and neck != "patch":
        raise ValueError(f"layers=cholesky is the authors' patch neck: it needs neck=patch, got neck={neck!r}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}")


def _add_neck_and_dense(children: OrderedDict[str, nn.Module], add_act: Callable[[str, int], None],
                        add_conv: Callable[..., None], *, neck: str, layers: str, width: int, flat: int, D: int,
                        dense: int) -> int:
    """The neck and dense stages of the module docstring's layout into ``children``
    (``add_act(name, channels)``: an activation, ``add_conv``: a ``--conv`` or free layer);
    returns the feature count entering the features stage (``D`` after a patch neck)."""
    if neck == "conv":
        for j in range(1, NECK_DOWNS + 1):
            add_conv(f"neck_down{j}", width, width, 3, 2, (BACKBONE_SIZE >> (j - 1),) * 2)
        children["to_vector"] = ToVector()
    elif layers == "cholesky":
        children["neck_conv"] = CholeskyPatchConv(width, PATCH)
        children["neck_flatten"] = Flatten()
        children["neck_dense"] = CholeskyLinear(flat, D)
        add_act("neck_act", D)
        flat = D
    else:
        children["neck_patch"] = PatchRearrange()
        add_conv("neck_conv", width * PATCH * PATCH, width, 1, 1, (BACKBONE_SIZE // PATCH,) * 2)
        children["to_vector"] = ToVector()
        add_conv("neck_dense", flat, D, 1, 1, (1, 1))
        add_act("neck_act", D)
        flat = D
    for j in range(1, dense + 1):
        if layers == "cholesky":  # the authors' LiResMLP: X = I + (W ⊙ γ)·dense^-1/2
            children[f"dense{j}"] = CholeskyLinear(D, D, quasi_residual_scale=dense ** -0.5)
        else:
            add_conv(f"dense{j}", flat if j == 1 else D, D, 1, 1, (1, 1))
        if j < dense:
            add_act(f"dense{j}_act", D)
    if layers == "cholesky":
        children["to_vector"] = ToVector()  # (N, D) → (N, D, 1, 1) for the features stage
    return flat


class LiResNet(nn.Module):
    """The network of the module docstring; the architecture protocol of lipcli (``body``,
    ``head``, ``features``, ``forward``, ``refresh_power_iteration``)."""

    def __init__(self, *, conv: Component, activation: Component, pool: Component, head: Component,
                 num_classes: int, in_channels: int = 3, mean: Sequence[float] = (0.5,),
                 std: Sequence[float] = (1.0,), image_size: Sequence[int] = (32, 32),
                 depth: int = 12, width: int = 128, block: str = "residual", dense: int = 8,
                 gamma: bool = False, depth_scale: bool = False, centering: bool = False,
                 stem_kernel: int = 3, neck: str = "conv", dense_width: int = 0,
                 features: str = "head", layers: str = "conv") -> None:
        super().__init__()
        _check_shape(depth=depth, width=width, dense=dense, block=block, stem_kernel=stem_kernel, neck=neck,
                     features=features, dense_width=dense_width, num_classes=num_classes, layers=layers)
        k = extra_downs(image_size)
        mean, std = tuple(mean), tuple(std)
        mean = mean * in_channels if len(mean) == 1 else mean
        std = std * in_channels if len(std) == 1 else std
        if len(mean) != in_channels or len(std) != in_channels:
            raise ValueError(f"mean/std need {in_channels} entries, got {len(mean)} and {len(std)}")
        head_features = "activation" if features == "act" else getattr(head.spec, "features", "pool")
        self.depth, self.width, self.block, self.dense = depth, width, block, dense
        self.num_classes, self.in_channels = num_classes, in_channels
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.head_features = head_features
        flat = width * (BACKBONE_SIZE >> NECK_DOWNS) ** 2
        D = dense_width or flat
        residual = {"gamma": gamma, "scale": depth ** -0.5 if depth_scale else 1.0, "centering": centering}

        self.layers = layers
        children: OrderedDict[str, nn.Module] = OrderedDict()
        size = (BACKBONE_SIZE, BACKBONE_SIZE)

        def add(name: str, component: Component, *args: Any) -> None:
            children[name] = component.build(*args)  # stamped with its promises by lipcli

        def add_conv(name: str, cin: int, cout: int, kernel: int, stride: int, on: tuple[int, int],
                     free: bool = layers == "free") -> None:
            """A ``--conv`` layer, or a :class:`FreeConv` on ``on``-sized inputs (``layers=free``;
            the stem also with ``layers=cholesky``)."""
            if free:
                children[name] = FreeConv(cin, cout, kernel, stride, on)
            else:
                add(name, conv, cin, cout, kernel, stride)

        free_stem = layers in ("free", "cholesky")  # the authors' stem: a free filter in both

        children["normalize"] = Normalize(mean, std)
        add_conv("stem_conv", in_channels, width, stem_kernel, 2, self.image_size, free_stem)
        add("stem_act", activation, width)
        for j in range(1, k + 1):
            add_conv(f"stem_down{j}", width, width, 3, 2, (BACKBONE_SIZE << (k + 1 - j),) * 2, free_stem)
            add(f"stem_down{j}_act", activation, width)
        for i in range(1, depth + 1):
            if block == "residual":
                children[f"block{i}_res"] = ResidualConv(width, size, **residual)
            else:
                add_conv(f"block{i}_conv", width, width, 3, 1, size)
            add(f"block{i}_act", activation, width)
        flat = _add_neck_and_dense(children, lambda name, n: add(name, activation, n), add_conv, neck=neck,
                                   layers=layers, width=width, flat=flat, D=D, dense=dense)
        if dense == 0 and flat != D:
            raise ValueError(f"dense_width={D} needs dense >= 1 (the neck gives {flat} features)")
        if head_features == "pool":
            add("features_pool", pool, D)
            D //= 2
        else:
            add("features_act", activation, D)
        children["flatten"] = Flatten()
        self.body = nn.Sequential(children)
        self.feature_dim = D
        self.head = head.build(D, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Penultimate features ``(N, D)`` (normalisation included)."""
        if x.dim() != 4 or tuple(x.shape[1:]) != (self.in_channels, *self.image_size):
            raise ValueError(f"liresnet expects inputs (N, {self.in_channels}, {self.image_size[0]}, "
                             f"{self.image_size[1]}); got {tuple(x.shape)}")
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    @torch.no_grad()
    def refresh_power_iteration(self, steps: int = 50) -> None:
        for module in self.modules():
            refresh = getattr(module, "refresh", None)
            if module is not self and callable(refresh):
                refresh(steps)

    def lipschitz_training_estimate(self) -> Tensor:
        """A differentiable ESTIMATE of ``Lip(features)`` for training losses (never a
        certificate): ``1/min std`` times the residual blocks' power-iteration values (and with
        ``layers=cholesky`` the stem's, as the authors' ``sub_lipschitz``); every other layer
        counts 1 (1-Lipschitz by construction, or nearly: SOC, the Cholesky layers)."""
        value = torch.tensor(self.body.normalize.lipschitz_upper_bound(),
                             device=self.body.normalize.std.device)
        for module in self.body:
            if isinstance(module, ResidualConv):
                value = value * module.training_lipschitz()
            elif isinstance(module, FreeConv) and self.layers == "cholesky":  # the authors' power iteration
                value = value * module.lipschitz_training_estimate()
            elif isinstance(module, FreeConv):  # layers=free: its guaranteed bound (a constant)
                value = value * module.lipschitz_upper_bound()
        return value

    def no_weight_decay_parameters(self) -> set[str]:
        return no_weight_decay_names(self)
