"""The lipcli plugin module of lipcli-liresnet (entry point ``liresnet``): the architecture
``liresnet`` and the training loss ``emma`` (both Hu et al., NeurIPS 2023)."""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ArchSpec, LossSpec, Param

from .emma import DEFAULT_EPS, emma_factory
from .network import BLOCKS, LiResNet


def liresnet_spec() -> ArchSpec:
    return ArchSpec(
        name="liresnet",
        factory=LiResNet,
        description="LiResNet/BRONet-shaped residual network: stem, constant-width backbone, "
                    "neck, dense layers, head",
        params=(
            Param(name="depth", type=int, default=12, help="backbone blocks (1-256)"),
            Param(name="width", type=int, default=128, help="backbone channels (1-4096)"),
            Param(name="block", type=str, default="residual", choices=BLOCKS,
                  help="residual: x + W*x with a free 3x3 W (LiResNet); conv: the --conv layer"),
            Param(name="dense", type=int, default=8, help="dense layers of width 16*width (0-64)"),
        ),
    )


def emma_spec() -> LossSpec:
    return LossSpec(
        name="emma",
        factory=emma_factory,
        description="EMMA (Hu et al. 2023): cross-entropy with each logit raised by its "
                    "clipped certified-radius margin",
        params=(
            Param(name="eps", type=float, default=DEFAULT_EPS,
                  help="target l2 radius in input space (default 36/255)"),
            Param(name="min_ratio", type=float, default=0.01,
                  help="smallest fraction of eps a margin is raised by (in (0, 1])"),
        ),
    )


@hookimpl
def lip_architectures() -> list[ArchSpec]:
    return [liresnet_spec()]


@hookimpl
def lip_losses() -> list[LossSpec]:
    return [emma_spec()]
