"""The recipe's optimiser: SGD with momentum and weight decay on the right parameters (SPEC §6)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def recipe_sgd(param_groups: list[dict[str, Any]], *, lr: float, momentum: float) -> torch.optim.SGD:
    """SGD with momentum (SPEC §6) over ``param_groups`` (``params``, ``weight_decay``).

    The fused implementation (one pass over each parameter, its gradient and its momentum
    buffer; about 3× faster than the per-tensor loop on CPU) is used where this torch build
    offers it for the parameters' device and dtype; otherwise the default one.  Both compute
    the same update (up to rounding)."""
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in param_groups]
    try:
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, fused=True)
    except (RuntimeError, ValueError, TypeError):
        return torch.optim.SGD(groups, lr=lr, momentum=momentum)


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """SGD parameter groups: weight decay only on >= 2-D parameters not listed as excluded.

    Exclusions come from ``model.no_weight_decay_parameters()`` when the architecture has it,
    else from every submodule's ``no_weight_decay`` attribute (local parameter names).
    """
    getter = getattr(model, "no_weight_decay_parameters", None)
    if callable(getter):
        excluded = set(getter())
    else:
        excluded = set()
        for prefix, module in model.named_modules():
            for local in getattr(module, "no_weight_decay", ()):
                excluded.add(f"{prefix}.{local}" if prefix else local)
    decay, no_decay = [], []
    decay_names, no_decay_names = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.dim() >= 2 and name not in excluded:
            decay.append(param)
            decay_names.append(name)
        else:
            no_decay.append(param)
            no_decay_names.append(name)
    return [
        {"params": decay, "weight_decay": weight_decay, "names": decay_names},
        {"params": no_decay, "weight_decay": 0.0, "names": no_decay_names},
    ]
