"""The lipcli plugin module of lipcli-lipnext (entry point ``lipnext``): the architecture
``lipnext`` (Hu, Hu, Fredrikson, ICLR 2026), the optimiser ``so-adam`` (Adam on the orthogonal
manifold) and the recipe ``lipnext``."""

from __future__ import annotations

from pathlib import Path

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.recipe_files import load_recipes
from lipcli.sdk.specs import ArchSpec, OptimizerSpec, Param, RecipeSpec

from .network import MAX_DEPTH, MAX_PATCH, MAX_WIDTH, lipnext_factory
from .optimizer import so_adam_spec


def lipnext_spec() -> ArchSpec:
    return ArchSpec(
        name="lipnext",
        factory=lipnext_factory,
        description="LipNeXt: patchify + Stiefel stem, blocks M R^T S(R(X+p)) + b with beta-Abs, "
                    "L2 spatial pooling, head (train with --optimizer so-adam)",
        params=(
            Param(name="depth", type=int, default=32, min=1, max=MAX_DEPTH, help="blocks (paper: 32)"),
            Param(name="width", type=int, default=1024, min=1, max=MAX_WIDTH,
                  help="channels C of the orthogonal C x C matrices (paper: 1024 or 2048 on CIFAR)"),
            Param(name="patch", type=int, default=2, min=1, max=MAX_PATCH,
                  help="stem patch size (token grid = image / patch; lipcli's choice: 2, LiResNet's "
                       "stride-2 stem grid)"),
            Param(name="beta", type=float, default=0.5, min=0.0, max=1.0,
                  help="beta-Abs: |x| on the first floor(beta C) channels (lipcli's choice: 0.5)"),
            Param(name="shift_ratio", type=float, default=0.125, min=0.0, max=0.25,
                  help="channels shifted per direction / C (paper: 1/8 or 1/16)"),
            Param(name="pool_eps", type=float, default=1e-6, min=0.0, max=1.0,
                  help="L2 pooling sqrt(sum x^2 + eps) (lipcli's choice; 1-Lipschitz for every eps)"),
        ),
    )


@hookimpl
def lip_architectures() -> list[ArchSpec]:
    return [lipnext_spec()]


@hookimpl
def lip_optimizers() -> list[OptimizerSpec]:
    return [so_adam_spec()]


@hookimpl
def lip_recipes() -> list[RecipeSpec]:
    return load_recipes(Path(__file__).with_name("recipes.toml"))
