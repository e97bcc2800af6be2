"""The lipcli plugin module (entry point ``lot`` in the ``lipcli`` group).

Provides one convolution component, ``lot``: ``lip train --conv lot`` (parameters inline,
e.g. ``--conv lot:iterations=20``), the head ``lot`` (:mod:`lipcli_lot.head`), the authors'
networks as the architectures ``lot-lipconvnet-<n>`` and ``lot-lipresnet-<n>``
(:mod:`lipcli_lot.network`), the importer ``lot`` (:mod:`lipcli_lot.importer`) and the recipes
``lot`` and ``lot-residual`` (``recipes.toml`` beside this module).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.recipe_files import load_recipes
from lipcli.sdk.specs import ArchSpec, ConvSpec, HeadSpec, ImporterSpec, Param, RecipeSpec

from lipcli.sdk.fourier_border import BORDERS

from .head import LOTHead
from .importer import DESCRIPTION, SOURCE, LOTImporter
from .lot import INITS, LOTConv
from .network import DEPTHS, MAX_WIDTH, LOTLipConvNet, lot_lipresnet

#: the most Newton-Schulz iterations (10 times the authors' 10; each one is two batched
#: matrix products per frequency, kept for the backward pass in training)
MAX_ITERATIONS = 100


def lot_spec() -> ConvSpec:
    """The ``lot`` conv spec: no promise (orthogonal only when the Newton–Schulz iteration has
    converged; ``‖W(f)‖ ≤ 1`` for any count in exact arithmetic); the layer's
    ``lipschitz_upper_bound()`` is a verified bound on the float matrices used, converged or
    not, which the certificates divide by."""
    return ConvSpec(
        name="lot",
        factory=LOTConv,
        description="LOT: per-frequency polar factor by Newton-Schulz iterations (Xu et al., NeurIPS 2022)",
        params=(
            Param(name="iterations", type=int, default=10, min=1, max=MAX_ITERATIONS,
                  help="Newton-Schulz iterations for (V^H V)^(-1/2), in training and eval (10: the authors')"),
            Param(name="eps", type=float, default=1e-4, min=0.0, max=1.0,
                  help="regulariser added to V^H V and its norm (the authors' 1e-4)"),
            Param(name="init", type=str, default="identity", choices=INITS,
                  help="identity: centre tap [I 0] (the authors' default); random"),
            Param(name="border", type=str, default="circular", choices=BORDERS,
                  help="circular: on the image's own torus; zero: zero-pad by k//2 and crop (the authors' code)"),
        ),
        promises=(),
    )


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [lot_spec()]


@hookimpl
def lip_recipes() -> list[RecipeSpec]:
    return load_recipes(Path(__file__).with_name("recipes.toml"))


@hookimpl
def lip_heads() -> list[HeadSpec]:
    return [HeadSpec(
        name="lot",
        factory=LOTHead,
        description="the LOT authors' last layer: a 1x1 LOT layer on the features (linear, exact lln certificate)",
        certificate="lln",
        params=(
            Param(name="iterations", type=int, default=10, min=1, max=MAX_ITERATIONS,
                  help="Newton-Schulz iterations (10: the authors')"),
            Param(name="eps", type=float, default=1e-4, min=0.0, max=1.0, help="regulariser (the authors' 1e-4)"),
        ),
    )]


_WIDTH = Param(name="width", type=int, default=32, min=1, max=MAX_WIDTH,
               help="channels of the first layer (the authors' --init-channels)")


#: the layer kinds the LOT authors' networks take from the user (stride-2 convolutions, no pool)
NO_POOL = ("conv", "activation", "head")


@hookimpl
def lip_architectures() -> list[ArchSpec]:
    plain = [ArchSpec(name=f"lot-lipconvnet-{n}", factory=partial(LOTLipConvNet, depth=n), params=(_WIDTH,),
                      slots=NO_POOL,
                      description=f"the LOT authors' LipConvNet-{n}: stride-2 convolutions C -> 2C, no pooling "
                                  "(use --conv lot:border=zero --head lln or lot)")
             for n in DEPTHS]
    residual = [ArchSpec(name=f"lot-lipresnet-{n}", factory=partial(lot_lipresnet, depth=n), slots=NO_POOL,
                         params=(_WIDTH, Param(name="mix", type=float, default=0.5, min=0.0, max=1.0,
                                               help="residual weight: x <- mix*x + (1-mix)*block(x) (the authors' 0.5)")),
                         description=f"the LOT authors' LipResNet-{n} (--residual): lot-lipconvnet-{n} with "
                                     "convex-combination residuals on the middle blocks")
                for n in DEPTHS]
    return plain + residual


@hookimpl
def lip_importers() -> list[ImporterSpec]:
    return [ImporterSpec(name="lot", factory=LOTImporter, source=SOURCE, description=DESCRIPTION)]
