"""The BRONet authors' backbone network (``ntuaislab/BRONet``, ``bronet/models/model.py::BRONet``
with ``backbone_type: bro`` and Cholesky neck and dense layers, the configuration of
``bronet/configs/benchmark_reproduce/cifar10.yaml``, commit 9d59c9bd15e8) as the architecture
``bronet``.  Width ``w``, ``D`` = ``dense_width``, an ``S × S`` input (``S`` even):

===========  =================================================================  ================
stage        body children, in order                                           output
===========  =================================================================  ================
normalise    ``normalize``: ``(x − mean)/std`` (the authors': ``x − 0.5``)        in @ S²
stem         ``stem_conv`` free ``k × k`` conv, stride 2, bias                   w @ (S/2)²
             (:class:`~lipcli_liresnet.free_conv.FreeConv`) + ``stem_act``
backbone     ``depth`` × [``block{i}_conv`` the ``--conv`` layer (w → w, 3×3)   w @ (S/2)²
             + ``block{i}_act``]
neck         ``neck_conv`` ``p × p`` stride-``p`` Cholesky conv                 D
             (:class:`~lipcli_liresnet.cholesky.CholeskyPatchConv`),
             ``neck_flatten``, ``neck_dense`` Cholesky linear
             ``w·(S/2p)² → D`` + bias, ``neck_act``
dense        ``dense`` × [``dense{j}`` Cholesky linear ``D → D`` + bias,         D
             ``dense{j}_act``]
head         the ``--head`` component (the authors': ``lln``) on all ``D``      classes
===========  =================================================================  ================

With ``--conv bro:rank=R,border=zero,ridge=1e-7`` each backbone block is the authors'
``LiResConvOrtho`` BRO layer in evaluation (their ``V = I + W·γ·depth^-1/2`` and
``bias − running_mean`` are what ``lip import --from bronet`` stores in ``weight`` and
``bias``).  To train it as the authors do, ``quasi_residual=true`` makes each block's BRO filter
``V₀ + (γ ⊙ W)·depth^-1/2`` and ``centering=true`` puts ``block{i}_center`` (batch centring,
a running mean in evaluation) between each block's BRO layer and its activation
(:mod:`lipcli_bro.backbone`; both 1-Lipschitz in training and evaluation), and
``dense_quasi_residual=true`` makes each dense layer orthogonalise ``X = I + (W ⊙ γ)·dense^-1/2``
(:class:`~lipcli_liresnet.cholesky.CholeskyLinear`, their ``LiResMLP``).  Guaranteed bound: ``(1/min std)`` times the stem's, the backbone layers' and the
Cholesky layers' ``lipschitz_upper_bound()`` (activations and the flatten are 1-Lipschitz),
:func:`lipcli.lipschitz.bound.guaranteed_upper_bound` over the body.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from torch import Tensor, nn

from lipcli_liresnet.cholesky import CholeskyLinear, CholeskyPatchConv
from lipcli_liresnet.free_conv import FreeConv
from lipcli.sdk.inputs import Normalize
from lipcli.sdk.specs import ONE_LIPSCHITZ, Component

from .backbone import Centering
from .network_base import AuthorsNetwork, check_arguments, per_channel

#: the authors' input shift (``BRONet.forward``: ``x.sub(0.5)``, no scaling)
AUTHORS_MEAN = (0.5, 0.5, 0.5)
AUTHORS_STD = (1.0, 1.0, 1.0)
MAX_WIDTH = 2048
MAX_DEPTH = 64
MAX_DENSE_WIDTH = 16384


class BRONet(AuthorsNetwork):
    """The network of the module docstring (lipcli's architecture protocol: ``body``,
    ``head``, ``features``, ``forward``)."""

    network_name = "the BRONet network"

    def __init__(self, *, conv: Component, activation: Component, pool: Component, head: Component,
                 num_classes: int, in_channels: int = 3, mean: Sequence[float] = AUTHORS_MEAN,
                 std: Sequence[float] = AUTHORS_STD, depth: int = 12, width: int = 512,
                 stem_kernel: int = 5, neck_patch: int = 4, dense: int = 8, dense_width: int = 2048,
                 image_size: Sequence[int] = (32, 32), quasi_residual: bool = False,
                 centering: bool = False, dense_quasi_residual: bool = False) -> None:
        super().__init__()
        del pool  # the stem and the neck downsample
        size = (int(image_size[0]), int(image_size[1]))
        mean, std = per_channel(mean, in_channels), per_channel(std, in_channels)
        check_arguments(((conv.name == "bro" or not (quasi_residual or centering),
                          f"quasi_residual and centering are the BRO backbone's (the authors' "
                          f"LiResConvOrtho): use --conv bro, got --conv {conv.name}"),
                         (size[0] % 2 == 0 and size[1] % 2 == 0 and size[0] // 2 % neck_patch == 0
                          and size[1] // 2 % neck_patch == 0,
                          f"the BRONet network needs an image side divisible by 2*neck_patch = "
                          f"{2 * neck_patch}, got {size[0]}x{size[1]}"),
                         (stem_kernel % 2 == 1, f"stem_kernel must be odd, got {stem_kernel}"),
                         (width % 2 == 0 and dense_width % 2 == 0,
                          f"width and dense_width must be even (MaxMin), got {width} and {dense_width}"),
                         (num_classes >= 2, f"num_classes must be at least 2, got {num_classes}"),
                         (len(mean) == len(std) == in_channels,
                          f"mean/std need {in_channels} entries, got {len(mean)} and {len(std)}")))
        self.depth, self.width, self.num_classes = depth, width, num_classes
        self.in_channels, self.image_size = in_channels, size
        side = (size[0] // 2, size[1] // 2)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        layers["normalize"] = Normalize(mean, std)
        layers["stem_conv"] = FreeConv(in_channels, width, stem_kernel, 2, size)
        layers["stem_act"] = activation.build(width)
        for i in range(1, depth + 1):
            # quasi_residual: the BRO filter V₀ + (γ ⊙ W)·depth^-1/2 (lipcli_bro.backbone)
            extra = {"quasi_residual_scale": depth ** -0.5} if quasi_residual else {}
            layers[f"block{i}_conv"] = block = conv.build(width, width, 3, 1, **extra)
            if centering:
                block.bias.requires_grad_(False)  # the centring removes it exactly (lipcli_bro.backbone)
                layers[f"block{i}_center"] = Centering(width)
            layers[f"block{i}_act"] = activation.build(width)
        layers["neck_conv"] = CholeskyPatchConv(width, neck_patch)
        layers["neck_flatten"] = flatten = nn.Flatten(1)
        flatten.lip_promises = (ONE_LIPSCHITZ,)  # a reshape
        layers["neck_dense"] = CholeskyLinear(width * (side[0] // neck_patch) * (side[1] // neck_patch), dense_width)
        layers["neck_act"] = activation.build(dense_width)
        for j in range(1, dense + 1):
            # dense_quasi_residual: X = I + (W ⊙ γ)·dense^-1/2, the authors' LiResMLP
            layers[f"dense{j}"] = CholeskyLinear(dense_width, dense_width,
                                                 quasi_residual_scale=dense ** -0.5 if dense_quasi_residual else None)
            layers[f"dense{j}_act"] = activation.build(dense_width)
        self.body = nn.Sequential(layers)
        self.input_lipschitz = 1.0 / min(std)
        self.feature_dim = dense_width
        self.head = head.build(dense_width, num_classes)

    def lipschitz_training_estimate(self) -> Tensor:
        """``1/min std`` times the stem's power-iteration ESTIMATE (the authors' training
        rule: every other layer 1-Lipschitz); feeds margin losses only, never a certificate."""
        stem: FreeConv = self.body.stem_conv  # type: ignore[assignment]
        return stem.lipschitz_training_estimate() * self.input_lipschitz
