"""The lipcli plugin module of lipcli-lipnext (entry point ``lipnext``): the optimiser
``so-adam`` (Adam on the orthogonal manifold)."""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import OptimizerSpec

from .optimizer import so_adam_spec


@hookimpl
def lip_optimizers() -> list[OptimizerSpec]:
    return [so_adam_spec()]
