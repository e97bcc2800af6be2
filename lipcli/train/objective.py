"""Loss plumbing for the trainer: resolve the ``loss`` setting, build the loss, the DDP-wrapped step.

The trainer knows no loss by name.  The loss is a ``loss`` component (``lip_losses`` hook,
protocol in :mod:`lipcli.sdk.losses`): the ``loss`` setting ``NAME:key=value`` or, when not
given, the head's ``HeadSpec.loss``.  Resolution order of each loss parameter: given inline in
``loss`` > its shortcut setting, declared by the loss spec (``Param.shortcut``, held in
``TrainConfig.loss_shortcuts``) > the spec's ``recipe(dataset)`` > the parameter's default.  ``grad_clip`` not given: the spec's ``grad_clip``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.losses import LossContext, LossOutput, TrainProgress, has_trainable_parameters, resolved_loss_params
from lipcli.sdk.specs import Component, LossSpec
from lipcli.train.config import TrainConfig
from lipcli.train.errors import TrainUsageError, literal
from lipcli.host.plugins import Registry, parse_component_choice
from lipcli.host.registry import component_choice_text


def resolve_loss(cfg: TrainConfig, head: Component, dataset_name: str, reg: Registry) -> tuple[TrainConfig, Component]:
    """The loss component of a run and the config with ``loss`` (every parameter written out)
    and ``grad_clip`` resolved; the shortcut settings are folded into ``loss`` (and cleared)."""
    default_loss = getattr(head.spec, "loss", "ce")
    choice = cfg.loss or default_loss
    name, inline = parse_component_choice(choice)
    spec = reg.get("loss", name)
    given: dict[str, Any] = dict(inline)
    for setting, value in cfg.loss_shortcuts.items():
        param = _shortcut_param(reg, spec, setting, cfg.loss is None, head.name)
        if param in inline:
            raise TrainUsageError(
                f"{{{setting}}} and {{loss}} {literal(choice)} both set {literal(repr(param))}; give it once")
        try:
            given[param] = spec.param(param).parse(value) if isinstance(value, str) else value
        except ValueError as exc:
            raise TrainUsageError(f"{{{setting}}}: {literal(exc)}") from None
    recipe = spec.recipe(dataset_name) if spec.recipe is not None else {}
    for key, value in recipe.items():
        given.setdefault(key, value)
    component = reg.component("loss", name, given)
    changes: dict[str, Any] = {"loss_shortcuts": {}, "loss": component_choice_text(name, component.params)}
    if cfg.grad_clip is None:
        changes["grad_clip"] = float(spec.grad_clip)
    return dataclasses.replace(cfg, **changes), component


def _shortcut_param(reg: Registry, spec: LossSpec, setting: str, head_default: bool, head_name: str) -> str:
    """The parameter of loss ``spec`` that shortcut ``setting`` sets (a usage error naming the
    losses that have it when ``spec`` has not)."""
    for p in spec.params:
        if p.shortcut == setting:
            return p.name
    having = {n: p.name for n in reg.names("loss") for p in reg.get("loss", n).params if p.shortcut == setting}
    param = next(iter(having.values()), setting)
    origin = f"loss {spec.name!r}" + (f" (head {head_name!r}'s default loss)" if head_default else "")
    raise TrainUsageError(
        f"{{{setting}}} sets the loss parameter {literal(repr(param))}, which {literal(origin)} "
        f"does not have; choose a loss with it ({{loss}} {literal(' | '.join(having) or 'none installed')})"
    )


def build_loss(component: Component, context: LossContext) -> nn.Module:
    """Call the loss factory; a rejected parameter or head is one usage error."""
    try:
        loss = component.build(context)
    except LipUsageError:
        raise
    except (ValueError, TypeError) as exc:
        raise LipUsageError(f"loss {component.name!r}: {exc}") from None
    if not isinstance(loss, nn.Module):
        raise LipUsageError(f"loss {component.name!r}: the factory returned "
                            f"{type(loss).__name__}, not an nn.Module")
    if has_trainable_parameters(loss):
        raise LipUsageError(f"loss {component.name!r} has trainable parameters; a loss must keep "
                            "its state in buffers")
    return loss.to(context.device)


def loss_record(component: Component, loss: nn.Module) -> dict[str, Any]:
    """The model file's ``training.loss`` record (component and the values used)."""
    record = component.to_config()
    record["params"] = resolved_loss_params(loss, component.params)
    return record


class TrainStep(nn.Module):
    """One training forward: ``loss(model, images, labels)`` (the module DDP wraps).

    ``forward(images, labels)`` returns ``(loss, clean_logits, parts)``; ``parts`` holds
    detached named scalars to log.
    """

    def __init__(self, model: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        out = self.loss(self.model, images, labels)
        if not isinstance(out, LossOutput):
            raise TypeError(f"loss {type(self.loss).__name__} returned {type(out).__name__}, "
                            "not a LossOutput")
        return out.loss, out.logits, out.parts

    def begin_epoch(self, progress: TrainProgress) -> None:
        """The loss's ``begin_epoch(progress)`` where it has one."""
        hook = getattr(self.loss, "begin_epoch", None)
        if callable(hook):
            hook(progress)

    def end_epoch(self) -> None:
        """The loss's ``end_epoch(model)`` where it has one."""
        hook = getattr(self.loss, "end_epoch", None)
        if callable(hook):
            hook(self.model)
