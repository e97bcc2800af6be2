"""Optimisers and schedules: the recipe's SGD with momentum and weight decay on the right
parameters (SPEC §6), AdamW / NAdam, the Lookahead wrapper, step / cosine schedules with
linear warm-up."""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lipcli.sdk.weight_decay import no_weight_decay_names
from lipcli.train.config import DEFAULT_BETAS, SCHEDULES


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
    excluded = set(getter()) if callable(getter) else no_weight_decay_names(model)
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


# ---------------------------------------------------------------------------------------------
# optimiser choices (--optimizer, --lookahead) and schedules (--schedule, --warmup-epochs)
# ---------------------------------------------------------------------------------------------
def make_optimizer(name: str, param_groups: list[dict[str, Any]], *, lr: float,
                   momentum: float, betas: Sequence[float] = DEFAULT_BETAS) -> torch.optim.Optimizer:
    """``sgd`` (the recipe's, :func:`recipe_sgd`), ``adamw`` or ``nadam`` over the
    weight-decay groups.  AdamW and NAdam decay the weights decoupled from the gradient
    (Loshchilov & Hutter), with ``betas`` (default torch's) and eps 1e-8;
    ``momentum`` is SGD's only."""
    if name == "sgd":
        return recipe_sgd(param_groups, lr=lr, momentum=momentum)
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in param_groups]
    b1, b2 = (float(b) for b in betas)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(b1, b2))
    if name == "nadam":
        return torch.optim.NAdam(groups, lr=lr, betas=(b1, b2), decoupled_weight_decay=True)
    raise ValueError(f"unknown optimizer {name!r}")


class Lookahead(torch.optim.Optimizer):
    """Lookahead (Zhang et al., NeurIPS 2019) around any optimiser, as LiResNet trains.

    The wrapped ("fast") optimiser steps as usual; every ``k`` steps the slow weights move
    ``alpha`` of the way to the fast ones, ``φ ← φ + α (θ − φ)``, and the fast weights restart
    from them, ``θ ← φ``.  ``param_groups`` are the wrapped optimiser's (so learning-rate
    schedulers and the gradient scaler act on it); the slow weights and the step count are
    part of :meth:`state_dict`.
    """

    def __init__(self, base: torch.optim.Optimizer, *, k: int = 5, alpha: float = 0.5) -> None:
        if k < 1 or not 0 < alpha <= 1:
            raise ValueError("lookahead needs k >= 1 and 0 < alpha <= 1")
        self.base, self.k, self.alpha = base, int(k), float(alpha)
        self.defaults = base.defaults
        self._optimizer_step_pre_hooks: Any = collections.OrderedDict()
        self._optimizer_step_post_hooks: Any = collections.OrderedDict()
        self._optimizer_state_dict_pre_hooks: Any = collections.OrderedDict()
        self._optimizer_state_dict_post_hooks: Any = collections.OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: Any = collections.OrderedDict()
        self._optimizer_load_state_dict_post_hooks: Any = collections.OrderedDict()
        self.slow = [p.detach().clone() for g in self.param_groups for p in g["params"]]
        self.count = 0

    # the wrapped optimiser's groups and state, also after its load_state_dict replaced them
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.base.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.base.state

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = self.base.step(closure)
        self.count += 1
        if self.count % self.k == 0:
            for slow, fast in zip(self.slow, self._params()):
                slow.add_(fast.detach() - slow, alpha=self.alpha)
                fast.copy_(slow)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"base": self.base.state_dict(), "slow": [s.clone() for s in self.slow],
                "count": self.count, "k": self.k, "alpha": self.alpha}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.base.load_state_dict(state_dict["base"])
        for slow, saved in zip(self.slow, state_dict["slow"]):
            slow.copy_(saved)
        self.count = int(state_dict["count"])


def make_schedule(optimizer: torch.optim.Optimizer, *, schedule: str, total_steps: int,
                  warmup_steps: int, milestones: list[float], gamma: float) -> Any:
    """The per-step learning-rate scheduler.

    ``step`` without warm-up is the recipe's ``MultiStepLR`` (×``gamma`` at the given
    fractions of all steps; a list, so equal milestones compound), exactly as before.
    Otherwise a ``LambdaLR`` with factor ``w(t) · s(t)``: the linear warm-up
    ``w(t) = min(1, (t + 1) / warmup_steps)`` and ``s(t)`` = the same step decay, or for
    ``cosine`` ``½ (1 + cos(π · min(1, (t − W) / (T − W))))`` after the ``W`` warm-up steps
    (from the base rate down to 0 at the last step ``T``), or for ``triangular`` SLL's
    ``TriangularLRScheduler`` (Lipschitz-SLL-Networks ``core/utils.py``): linear through
    ``(0, 0)``, ``(⌊2T/5⌋, 1)``, ``(⌊4T/5⌋, 1/20)``, ``(T, 0)``, and as their loop calls it
    (``scheduler.step(t)`` after step ``t``) step ``t ≥ 1`` runs at the value at ``t − 1``
    and step 0 at the full rate.  ``onecycle``: torch's ``OneCycleLR`` with its defaults
    (``max_lr`` the base rate; momentum cycled 0.85–0.95 for SGD; warm-up is its own).
    """
    steps = [int(f * total_steps) for f in milestones]
    if schedule == "onecycle":  # torch's defaults (the comparison study's); its own warm-up phase
        base = optimizer.base if isinstance(optimizer, Lookahead) else optimizer
        return torch.optim.lr_scheduler.OneCycleLR(base, max_lr=[g["lr"] for g in base.param_groups],
                                                   total_steps=max(1, total_steps))
    if schedule == "step" and warmup_steps == 0:
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=steps, gamma=gamma)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}")

    def factor(t: int) -> float:
        warm = min(1.0, (t + 1) / warmup_steps) if warmup_steps else 1.0
        if schedule == "step":
            return warm * gamma ** sum(1 for m in steps if t >= m)
        if schedule == "triangular":
            return warm * (1.0 if t == 0 else triangular(t - 1, total_steps))
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, max(0.0, (t - warmup_steps) / span))
        return warm * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def triangular(t: float, total_steps: int) -> float:
    """SLL's triangular factor at step ``t`` of ``total_steps`` (see :func:`make_schedule`)."""
    xs = (0, total_steps * 2 // 5, total_steps * 4 // 5, total_steps)
    ys = (0.0, 1.0, 1.0 / 20.0, 0.0)
    if t <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if t <= x1:
            return y1 if x1 == x0 else y0 + (y1 - y0) * (t - x0) / (x1 - x0)
    return ys[-1]


def build_optimization(cfg: Any, model: nn.Module, *, steps_per_epoch: int) -> tuple[list, Any, Any]:
    """The weight-decay groups, optimiser (with lookahead where asked) and per-step scheduler
    of a run (``cfg``: a resolved :class:`~lipcli.train.config.TrainConfig`)."""
    groups = weight_decay_groups(model, cfg.weight_decay)
    optimizer = build_optimizer(cfg, model, groups)
    total = cfg.epochs * steps_per_epoch
    warmup = int(round(cfg.warmup_epochs * steps_per_epoch))
    scheduler = make_schedule(optimizer, schedule=cfg.schedule, total_steps=total,
                              warmup_steps=warmup, milestones=list(cfg.lr_milestones),
                              gamma=cfg.lr_gamma)
    return groups, optimizer, scheduler


def build_optimizer(cfg: Any, model: nn.Module, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """The ``--optimizer`` component (kind ``optimizer``, :mod:`lipcli.sdk.optimizers`) over
    the weight-decay ``groups``, with the run's lookahead."""
    from lipcli.host.plugins import get_registry  # lazy: loads the plugins
    from lipcli.sdk.optimizers import OptimizerContext

    reg = get_registry()

    def euclidean(choice: str, part: list[dict[str, Any]]) -> torch.optim.Optimizer:
        return reg.component("optimizer", choice).build(dataclasses.replace(context, groups=part, lookahead=0))

    def wrap(optimizer: torch.optim.Optimizer) -> Lookahead:
        return Lookahead(optimizer, k=cfg.lookahead, alpha=cfg.lookahead_alpha)

    b1, b2 = (float(b) for b in cfg.betas)
    context = OptimizerContext(groups=groups, model=model, lr=cfg.lr, momentum=cfg.momentum, betas=(b1, b2),
                               lookahead=cfg.lookahead, lookahead_alpha=cfg.lookahead_alpha,
                               euclidean=euclidean, lookahead_wrapper=wrap)
    return reg.component("optimizer", cfg.optimizer).build(context)


def optimization_record(cfg: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The model file's ``training.optimization`` record: the resolved choice (an optimiser
    with parameters also records them, ``params``, and what it reports of itself, ``record()``)."""
    base = optimizer.base if isinstance(optimizer, Lookahead) else optimizer
    extra: dict[str, Any] = {}
    if ":" in cfg.optimizer:
        from lipcli.host.plugins import get_registry
        from lipcli.host.registry import parse_component_choice

        extra["params"] = get_registry().component("optimizer", cfg.optimizer).params
        extra["name"] = parse_component_choice(cfg.optimizer)[0]
    if callable(getattr(base, "record", None)):
        extra.update(base.record())
    return {**extra,
        "optimizer": cfg.optimizer, "class": type(base).__name__, "lr": cfg.lr,
        "momentum": cfg.momentum if cfg.optimizer == "sgd" else None,
        "betas": list(base.defaults["betas"]) if "betas" in base.defaults else None,
        "weight_decay": cfg.weight_decay,
        "lookahead": {"k": cfg.lookahead, "alpha": cfg.lookahead_alpha} if cfg.lookahead else None,
        "schedule": cfg.schedule, "warmup_epochs": cfg.warmup_epochs,
        "lr_milestones": list(cfg.lr_milestones) if cfg.schedule == "step" else None,
        "lr_gamma": cfg.lr_gamma if cfg.schedule == "step" else None,
    }
