"""The lipcli plugin module (entry point ``lot`` in the ``lipcli`` group).

Provides one convolution component, ``lot``: ``lip train --conv lot`` (parameters inline,
e.g. ``--conv lot:iterations=20``), and the recipes ``lot`` and ``lot-residual``
(``recipes.toml`` beside this module).
"""

from __future__ import annotations

from pathlib import Path

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.recipe_files import load_recipes
from lipcli.sdk.specs import ConvSpec, Param, RecipeSpec

from .lot import INITS, LOTConv

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
        ),
        promises=(),
    )


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [lot_spec()]


@hookimpl
def lip_recipes() -> list[RecipeSpec]:
    return load_recipes(Path(__file__).with_name("recipes.toml"))
