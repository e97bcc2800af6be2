"""The built-in optimiser plugin (registered as ``lipcli.optimizers``): ``sgd``, ``adamw`` and
``nadam``, each wrapped in Lookahead when ``--lookahead K`` asks (protocol:
:mod:`lipcli.sdk.optimizers`).  Their default learning rates are
:data:`lipcli.train.config.OPTIMIZER_LR` (declared there, read by ``lip train --help``)."""

from __future__ import annotations

from typing import Any

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.optimizers import OptimizerContext
from lipcli.sdk.specs import OptimizerSpec
from lipcli.train.config import OPTIMIZER_LR

__all__ = ["lip_optimizers"]

_DESCRIPTIONS = {
    "sgd": "SGD with momentum and weight decay on the >= 2-D parameters (the paper's)",
    "adamw": "AdamW (decoupled weight decay), --betas, eps 1e-8",
    "nadam": "NAdam with decoupled weight decay, --betas, eps 1e-8",
}


def _factory(name: str) -> Any:
    def factory(context: OptimizerContext) -> Any:
        from lipcli.train.optim import make_optimizer  # lazy: the trainer's, unchanged

        optimizer = make_optimizer(name, context.groups, lr=context.lr, momentum=context.momentum,
                                   betas=context.betas)
        return context.lookahead_wrapper(optimizer) if context.lookahead else optimizer

    return factory


@hookimpl
def lip_optimizers() -> list[OptimizerSpec]:
    return [OptimizerSpec(name=name, factory=_factory(name), description=_DESCRIPTIONS[name],
                          default_lr=lr) for name, lr in OPTIMIZER_LR.items()]
