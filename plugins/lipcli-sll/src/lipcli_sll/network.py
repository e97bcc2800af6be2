"""The SLL authors' networks (Araujo et al., ICLR 2023; ``araujoalexandre/Lipschitz-SLL-Networks``,
``core/models/model.py``: ``LipschitzNetwork``; sizes from ``main.py`` and
``reproduce_tables.py``) as the architectures ``sll-small``, ``sll-medium``, ``sll-large`` and
``sll-xlarge``.

Layout for an ``S × S`` input (``S`` a multiple of 4), width ``w``, ``depth`` convolutions,
``dense`` dense layers, ``D = w·(S/4)²``:

============  ==============================================================  ============
stage         layers (body children, in order)                                output
============  ==============================================================  ============
normalise     ``normalize``: ``(x − mean)·(1/std)``                           in @ S²
convolutions  ``conv1`` conv(in → w, 3×3) — with ``--conv sll``: zero         w @ S²
              channels up to ``w`` then an SLL layer, the authors'
              ``PaddingChannels`` + first layer — then ``conv2 .. conv{depth}``
              (``depth = 0``: ``pad``, the zero channels alone)
              conv(w → w, 3×3); no activation (SLL has its own ReLU)
pool          ``pool``: 4×4 window sums divided by 4 (the authors'            D @ 1²
              ``AvgPool2d(4, divisor_override=4)``), as a ``(N, D, 1, 1)``
              vector
dense         ``dense`` × ``dense{j}``: the SLL dense                         D @ 1²
              layer on ``D`` features with ``dense_hidden`` hidden units
              (an :class:`~lipcli_sll.conv.SLLConv` with a 1×1 filter on a
              1×1 image is exactly the dense layer)
features      ``flatten``                                                     D
head          the ``--head`` component on ``(N, D)`` (the authors': ``lln``)  classes
============  ==============================================================  ============

The authors' sizes (``depth, dense, w, dense_hidden``): small 20, 7, 45, 2048; medium 30, 10,
60, 2048; large 50, 10, 90, 2048; xlarge 70, 15, 120, 2048; every convolution with 5 hidden
channels (``conv_inner_dim = 5``) and ``log_q ~ N(0, 1)``: ``--conv sll:hidden=5,q_init=normal``
(the convolution is the ``--conv`` component; the dense layers take ``q_init`` here).

Guaranteed bound: ``Lip(features) ≤ Π U_child``: ``max 1/std`` (as stored), the
convolutions' and dense layers' verified bounds (:func:`lipcli_sll.core.sll_bound`), and 1 for
the pool and the flatten.  The pool is 1-Lipschitz: each output is ``(1/4)·Σ`` of 16 inputs of its own window,
``|Σ_{16} x_i| ≤ 4‖x_window‖`` (Cauchy–Schwarz), and the windows are disjoint.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.sdk.specs import ONE_LIPSCHITZ, Component

from .conv import SLLConv

#: the authors' sizes: name -> (depth, dense, width, dense_hidden)
SIZES = {"small": (20, 7, 45, 2048), "medium": (30, 10, 60, 2048), "large": (50, 10, 90, 2048),
         "xlarge": (70, 15, 120, 2048)}
#: the authors' hidden channels of every convolution (``conv_inner_dim``)
AUTHORS_CONV_HIDDEN = 5
MAX_DEPTH, MAX_DENSE, MAX_WIDTH, MAX_DENSE_HIDDEN = 200, 64, 512, 65536
#: the pool's window (and the factor ``S`` must be a multiple of)
WINDOW = 4


class InputScale(nn.Module):
    """The input normalisation as ``(x − mean)·s`` per channel with the stored float32
    ``s ≈ 1/std``: a diagonal map whose norm is exactly ``max |s|`` for the numbers used."""

    lip_promises: tuple[str, ...] = ()

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        std64 = torch.tensor(tuple(std), dtype=torch.float64)
        if not bool((std64 > 0).all()):
            raise ValueError(f"std must be positive, got {tuple(std)}")
        self.register_buffer("shift", torch.tensor(tuple(mean), dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("scale", (1.0 / std64).to(torch.float32).view(1, -1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.shift.to(x.dtype)) * self.scale.to(x.dtype)

    def lipschitz_upper_bound(self) -> float:
        return float(self.scale.detach().double().abs().max())

    def export_module(self) -> nn.Module:
        return self


class PoolToVector(nn.Module):
    """4×4 window sums divided by 4 (1-Lipschitz, module docstring), as ``4·avg_pool2d(x, 4)``
    (the factor 4 and the averaging's 1/16 are exact scalings), reshaped to ``(N, D, 1, 1)``."""

    lip_promises = (ONE_LIPSCHITZ,)

    def forward(self, x: Tensor) -> Tensor:
        pooled = F.avg_pool2d(x, WINDOW) * float(WINDOW)
        return pooled.reshape(pooled.shape[0], -1, 1, 1)

    def export_module(self) -> nn.Module:
        return self


class PadChannels(nn.Module):
    """Zero channels appended up to ``width`` (the authors' ``PaddingChannels(mode="zero")``):
    the network's first layer when it has no convolution (``depth = 0``); an isometry."""

    lip_promises = (ONE_LIPSCHITZ,)

    def __init__(self, in_channels: int, width: int) -> None:
        super().__init__()
        self.in_channels, self.width = int(in_channels), int(width)

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x, (0, 0, 0, 0, 0, self.width - x.shape[1]))

    def export_module(self) -> nn.Module:
        return self


class SLLNetwork(nn.Module):
    """The network of the module docstring (lipcli's architecture protocol: ``body``,
    ``head``, ``features``, ``forward``)."""

    def __init__(self, *, conv: Component, activation: Component, pool: Component, head: Component,
                 num_classes: int, in_channels: int = 3, mean: Sequence[float] = (0.0,),
                 std: Sequence[float] = (1.0,), image_size: Sequence[int] = (32, 32),
                 depth: int = 20, dense: int = 7, width: int = 45, dense_hidden: int = 2048,
                 q_init: str = "ones") -> None:
        super().__init__()
        del activation, pool  # SLL layers carry their own ReLU; the pool is the authors' sum pool
        size = (int(image_size[0]), int(image_size[1]))
        if size[0] % WINDOW or size[1] % WINDOW:
            raise ValueError(f"the SLL network needs an image size divisible by {WINDOW}, got "
                             f"{size[0]}x{size[1]}")
        for name, value, low, top in (("depth", depth, 0, MAX_DEPTH), ("width", width, 1, MAX_WIDTH)):
            if not low <= value <= top:
                raise ValueError(f"{name} must be in 1..{top}, got {value}")
        if not 0 <= dense <= MAX_DENSE:
            raise ValueError(f"dense must be in 0..{MAX_DENSE}, got {dense}")
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        mean, std = tuple(mean), tuple(std)
        mean = mean * in_channels if len(mean) == 1 else mean
        std = std * in_channels if len(std) == 1 else std
        if len(mean) != in_channels or len(std) != in_channels:
            raise ValueError(f"mean/std need {in_channels} entries, got {len(mean)} and {len(std)}")
        self.depth, self.dense, self.width = depth, dense, width
        self.num_classes, self.in_channels, self.image_size = num_classes, in_channels, size
        D = width * (size[0] // WINDOW) * (size[1] // WINDOW)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        layers["normalize"] = InputScale(mean, std)
        if depth:
            layers["conv1"] = conv.build(in_channels, width, 3, 1)
        else:  # no convolution (the authors' n_conv 0): their PaddingChannels alone
            if width < in_channels:
                raise ValueError(f"width {width} below the {in_channels} input channels")
            layers["pad"] = PadChannels(in_channels, width)
        for i in range(2, depth + 1):
            layers[f"conv{i}"] = conv.build(width, width, 3, 1)
        layers["pool"] = PoolToVector()
        for j in range(1, dense + 1):
            layers[f"dense{j}"] = SLLConv(D, D, 1, 1, hidden=int(dense_hidden) or D, q_init=q_init)
        layers["flatten"] = flatten = nn.Flatten(1)
        flatten.lip_promises = (ONE_LIPSCHITZ,)  # a reshape (plain torch: exported as it is)
        self.body = nn.Sequential(layers)
        self.feature_dim = D
        self.head = head.build(D, num_classes)

    @torch.no_grad()
    def refresh_power_iteration(self, steps: int = 50) -> None:
        """Refresh the power-iteration state of layers that keep one (a ``--conv soc`` in this
        layout; SLL layers have none).  Weight decay: the default exclusions
        (:func:`lipcli.sdk.weight_decay.no_weight_decay_names`)."""
        for refresh in (getattr(m, "refresh", None) for m in self.modules() if m is not self):
            if callable(refresh):
                refresh(steps)

    def features(self, x: Tensor) -> Tensor:
        """Penultimate features ``(N, D)`` (normalisation included); inputs of one shape only,
        ``(N, in, S, S)``, the size the dense layers are built for."""
        expected = (self.in_channels, *self.image_size)
        if tuple(x.shape[1:]) != expected or x.dim() != 4:
            raise ValueError(f"the SLL network expects inputs (N, {', '.join(map(str, expected))}); "
                             f"got {tuple(x.shape)}")
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))
