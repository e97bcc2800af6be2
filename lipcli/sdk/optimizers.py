"""The optimiser protocol (component kind ``optimizer``, hook ``lip_optimizers``).

``lip train --optimizer NAME[:key=value,...]`` builds ``spec.factory(context, **params)``
with an :class:`OptimizerContext` and steps what it returns: a ``torch.optim.Optimizer``
(``param_groups``, ``step``, ``zero_grad``, ``state_dict``/``load_state_dict``).  The
learning-rate schedule acts on its ``param_groups`` (every group's ``lr``); everything that
must survive ``--resume`` belongs in ``state_dict()`` (tensors, numbers, strings, lists and
dicts of them), which every checkpoint stores.  Optional: ``end_epoch()``, called after each
epoch before the checkpoint (a retraction onto a manifold, say).  With ``context.lookahead``
> 0 the optimiser applies Lookahead itself (``context.lookahead_wrapper`` wraps a Euclidean
one); ``context.euclidean(name, groups)`` builds another optimiser component for a part of
the parameters (so a manifold optimiser steps the rest with the user's choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

__all__ = ["OptimizerContext"]


@dataclass(frozen=True)
class OptimizerContext:
    """What an optimiser factory gets.

    ``groups``: the weight-decay groups (``params``, ``weight_decay``, ``names``); ``model``:
    the network (for declared orthogonal parameters, :mod:`lipcli.sdk.orthogonal`); ``lr``,
    ``momentum``, ``betas``: the run's settings; ``lookahead`` (k, 0 = off) and
    ``lookahead_alpha``; ``euclidean(name, groups)``: the optimiser component ``name``
    (without Lookahead) over ``groups``; ``lookahead_wrapper(optimizer)``: Lipcli's Euclidean
    Lookahead around it with the run's k and alpha."""

    groups: list[dict[str, Any]]
    model: nn.Module
    lr: float
    momentum: float
    betas: tuple[float, float]
    lookahead: int
    lookahead_alpha: float
    euclidean: Callable[[str, list[dict[str, Any]]], Any]
    lookahead_wrapper: Callable[[Any], Any]
