"""The lipcli plugin module (entry point ``sll`` in the ``lipcli`` group).

Provides one convolution component, ``sll``: ``lip train --conv sll`` (options
``--conv sll:kernel=3,inner_factor=2``), and the recipe ``sll-small`` (``recipes.toml`` beside this module).
"""

from __future__ import annotations

from pathlib import Path

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.recipe_files import load_recipes
from lipcli.sdk.specs import ConvSpec, Param, RecipeSpec

from .conv import SLLConv

#: the largest residual-branch filter and hidden-units factor
MAX_KERNEL, MAX_INNER_FACTOR = 15, 16


def factory(in_channels: int, out_channels: int, kernel_size: int, stride: int, *,
            kernel: int = 0, inner_factor: int = 1) -> SLLConv:
    """ConvSpec factory (channel handling: :mod:`lipcli_sll.conv`)."""
    return SLLConv(in_channels, out_channels, kernel_size, stride, kernel=kernel,
                   inner_factor=inner_factor)


def sll_spec() -> ConvSpec:
    """The ``sll`` conv spec: no promise; the layer's ``lipschitz_upper_bound()`` is a
    verified bound (about 1 + 1e-6 for float32 weights) on the parameters actually used."""
    return ConvSpec(
        name="sll",
        factory=factory,
        description="SLL: SDP-based 1-Lipschitz residual layer x - 2W T^-1 relu(W^T x + b) (Araujo et al., ICLR 2023)",
        params=(
            Param(name="kernel", type=int, default=0, min=1, max=MAX_KERNEL, odd=True, auto=0,
                  help="filter size of the residual branch (odd); 0: the architecture's"),
            Param(name="inner_factor", type=int, default=1, min=1, max=MAX_INNER_FACTOR,
                  help="hidden units per channel of the residual branch"),
        ),
        promises=(),
    )


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [sll_spec()]


@hookimpl
def lip_recipes() -> list[RecipeSpec]:
    return load_recipes(Path(__file__).with_name("recipes.toml"))
