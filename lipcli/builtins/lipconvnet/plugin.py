"""The architecture built-in plugin (registered as ``lipcli.lipconvnet``): ``lipconvnet-<n>``
for every depth in :data:`~lipcli.builtins.lipconvnet.network.DEPTHS` (SPEC §3), built by
:class:`~lipcli.builtins.lipconvnet.network.LipConvnet`, and the paper's recipe ``lipconvnet``
(``recipes.toml`` beside this module)."""

from __future__ import annotations

from pathlib import Path

from functools import partial

from lipcli.builtins.lipconvnet.network import DEPTHS, LipConvnet
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.recipe_files import load_recipes
from lipcli.sdk.specs import ArchSpec, Param, RecipeSpec

#: the widest stem a LipConvnet takes (its last block has 16 times as many channels: 4096)
MAX_WIDTH = 256

__all__ = ["lip_architectures", "lip_recipes"]


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
    ]



@hookimpl
def lip_recipes() -> list[RecipeSpec]:
    return load_recipes(Path(__file__).with_name("recipes.toml"))
