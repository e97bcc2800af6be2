"""The architecture built-in plugin (registered as ``lipcli.lipconvnet``): ``lipconvnet-<n>``
for every depth in :data:`~lipcli.builtins.lipconvnet.network.DEPTHS` (SPEC §3), built by
:class:`~lipcli.builtins.lipconvnet.network.LipConvnet`, and ``lipresnet-<n>``, the same with
the LOT authors' convex-combination residuals (:mod:`lipcli.builtins.lipconvnet.residual`), and the paper's recipe
``lipconvnet`` (``recipes.toml`` beside this module)."""

from __future__ import annotations

from pathlib import Path

from functools import partial

from lipcli.builtins.lipconvnet.importer import SOURCE, ImprovedL2Importer
from lipcli.builtins.lipconvnet.network import DEPTHS, LipConvnet
from lipcli.builtins.lipconvnet.residual import AUTHORS_MIX, LipResNet
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.recipe_files import load_recipes
from lipcli.sdk.specs import ArchSpec, ImporterSpec, Param, RecipeSpec

#: the widest stem a LipConvnet takes (its last block has 16 times as many channels: 4096)
MAX_WIDTH = 256

__all__ = ["lip_architectures", "lip_importers", "lip_recipes"]


@hookimpl
def lip_architectures() -> list[ArchSpec]:
    return [
        ArchSpec(
            name=f"lipconvnet-{n}",
            factory=partial(LipConvnet, depth=n),  # depth bound per name
            description=f"LipConvnet-{n}: {n + 1} convolutions in 5 blocks of {n // 5} (paper §7)",
            params=(Param(name="width", type=int, default=32, min=1, max=MAX_WIDTH,
                          help="channels after the stem"),),
        )
        for n in DEPTHS
    ] + [
        ArchSpec(
            name=f"lipresnet-{n}",
            factory=partial(LipResNet, depth=n),
            description=f"LipConvnet-{n} with the LOT authors' convex-combination residuals "
                        "(Xu et al. 2022, train_robust.py --residual)",
            params=(Param(name="width", type=int, default=32, min=1, max=MAX_WIDTH,
                          help="channels after the stem"),
                    Param(name="mix", type=float, default=AUTHORS_MIX, min=0.0, max=1.0,
                          help="skip weight: x <- mix*x + (1-mix)*block(x) (the authors' sigmoid(0) = 0.5)")),
        )
        for n in DEPTHS
    ]



@hookimpl
def lip_recipes() -> list[RecipeSpec]:
    return load_recipes(Path(__file__).with_name("recipes.toml"))


@hookimpl
def lip_importers() -> list[ImporterSpec]:
    return [
        ImporterSpec(
            name="improved-l2", factory=ImprovedL2Importer, source=SOURCE,
            description="LipConvNet (SOC, MaxMin, max pool; LLN or CRC head) saved by the paper's "
                        "train_robust.py",
        ),
    ]
