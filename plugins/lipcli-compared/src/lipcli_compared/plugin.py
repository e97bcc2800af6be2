"""The lipcli plugin module (entry point ``compared`` in the ``lipcli`` group).

Provides the architectures ``convnet-xs`` .. ``convnet-l`` (:mod:`lipcli_compared.network`), the
head ``first-channels`` (certified by lipcli-ortho-head's ``margin``: margin / (√2·L)) and the
recipe ``layers-compared`` (``recipes.toml`` beside this module).
"""

from __future__ import annotations

from pathlib import Path

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.recipe_files import load_recipes
from lipcli.sdk.specs import ArchSpec, HeadSpec, LossSpec, Param, RecipeSpec

from .loss import OFFSET, TEMPERATURE, OffsetCrossEntropy

from .network import KERNEL, LAYERS_PER_BLOCK, MAX_LAYERS, MAX_WIDTH, SIZES, ComparedConvNet, first_channels_head


def network_specs() -> list[ArchSpec]:
    return [ArchSpec(
        name=f"convnet-{size}",
        factory=ComparedConvNet,
        description=f"the comparison study's ConvNet{size.upper()} (Prach et al., CVPR 2024): width {width}, "
                    f"{LAYERS_PER_BLOCK} convolutions per downsizing block, the method's dense layer "
                    "(use --head first-channels)",
        params=(
            Param(name="width", type=int, default=width, min=1, max=MAX_WIDTH, help="base channels w"),
            Param(name="layers", type=int, default=LAYERS_PER_BLOCK, min=1, max=MAX_LAYERS,
                  help="convolutions per downsizing block"),
            Param(name="kernel", type=int, default=KERNEL, min=1, max=15, odd=True,
                  help="kernel size of the block convolutions (1x1 in the last block)"),
            Param(name="center", type=bool, default=True,
                  help="subtract the channel means only (std 1), as the study; no: divide by the data set's std too"),
        ),
    ) for size, width in SIZES.items()]


def head_spec() -> HeadSpec:
    return HeadSpec(
        name="first-channels",
        factory=first_channels_head,
        description="the first num_classes features as logits (the comparison study's head)",
        certificate="margin",
        features="activation",
        loss="offset-ce",
    )


def loss_spec() -> LossSpec:
    return LossSpec(
        name="offset-ce",
        factory=OffsetCrossEntropy,
        description="offset cross-entropy T*CE((f - u*onehot)/T) with the offset u in logit space "
                    "(Prach & Lampert 2022; the comparison study's loss)",
        params=(
            Param(name="temperature", type=float, default=TEMPERATURE, min=1e-6, max=1e6, help="temperature T"),
            Param(name="offset", type=float, default=OFFSET, min=0.0, max=1e6,
                  help="offset u subtracted from the true class's logit (study: 2*sqrt(2)*36/255)"),
        ),
    )


@hookimpl
def lip_losses() -> list[LossSpec]:
    return [loss_spec()]


@hookimpl
def lip_architectures() -> list[ArchSpec]:
    return network_specs()


@hookimpl
def lip_heads() -> list[HeadSpec]:
    return [head_spec()]


@hookimpl
def lip_recipes() -> list[RecipeSpec]:
    return load_recipes(Path(__file__).with_name("recipes.toml"))
