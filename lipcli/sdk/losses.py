"""The training-loss protocol shared by every ``lip_losses`` plugin.

A *training loss* is what a :class:`~lipcli.sdk.specs.LossSpec` factory returns::

    loss = spec.factory(context, **params)     # context: LossContext, params: the spec's Params

It is an ``nn.Module`` (so that its buffers are saved in checkpoints, moved to the device and,
under DDP, broadcast with the model) whose forward pass is one training step's objective::

    out = loss(model, images, labels)          # -> LossOutput(loss, logits, parts)

* ``model`` follows the architecture protocol (``model(x)``, ``model.features(x)``,
  ``model.head``); ``images`` are in ``[0, 1]`` (the model normalises them), ``labels`` are
  class indices.  The step may run under autocast; compute the loss in float32.
* ``out.loss``: the scalar to minimise (with autograd history);
* ``out.logits``: the clean logits ``model(images)`` (detached is fine), used for the
  training accuracy;
* ``out.parts``: named extra scalars to log (detached), averaged over the epoch and written
  to the training log as ``train_<name>`` (e.g. ``{"curvature": ...}``); ``{}`` for none.

Optional members:

* ``end_epoch(model)``: called once after every epoch (after the model's power-iteration
  refresh, before evaluation and the checkpoint), e.g. to advance a power iteration;
* ``resolved_params() -> dict``: the parameter values actually used when the factory derived
  some of them (stored in the model file instead of the given ones).

A loss must not have trainable parameters (the optimiser sees only the model's); all state
that must survive a resume lives in persistent buffers.  The loss is used only for training:
it never enters a certificate, so it needs no soundness promise.  Random numbers must come
from torch's global generator (the trainer seeds it per epoch, so resumed runs stay
bit-identical) or from a generator seeded from ``context.seed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@dataclass(frozen=True)
class LossContext:
    """What a loss factory may know about the run (read-only).

    Attributes:
        model: the freshly built network (on ``device``, before training).
        num_classes: number of classes.
        dataset: the data set's name (e.g. ``"cifar10"``), for data-set dependent recipes.
        mean, std: the input normalisation (per channel); ``1 / min(std)`` is the Lipschitz
            factor between input space and the normalised input (SPEC §5).
        seed: the run's seed (for a loss's own generators).
        device: where the model lives.
        refresh_steps: the trainer's power-iteration steps per refresh (``power_iter_steps``).
    """

    model: nn.Module
    num_classes: int
    dataset: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    refresh_steps: int = 50

    @property
    def input_lipschitz(self) -> float:
        """``1 / min(std)``: input space -> normalised input.  Every other LipConvnet layer is
        1-Lipschitz (up to the SOC series' truncation, SPEC §5), so this is also the training
        losses' value of ``Lip(g)``; certificates use the guaranteed bound instead."""
        return 1.0 / min(float(s) for s in self.std)


@dataclass
class LossOutput:
    """One step's objective: ``loss`` (to minimise), clean ``logits``, logged ``parts``."""

    loss: torch.Tensor
    logits: torch.Tensor
    parts: dict[str, torch.Tensor] = field(default_factory=dict)


@runtime_checkable
class TrainingLoss(Protocol):
    """Structural type of a training loss (see the module docstring)."""

    def __call__(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> LossOutput: ...


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or unchanged when it is float64 already (float64 gradient checks)."""
    return t if t.dtype == torch.float64 else t.float()


def class_margins(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``f_l − f_j`` for every class ``j``, with ``+inf`` at ``j = l``: shape ``(N, c)``."""
    true = logits.gather(1, labels[:, None])
    margins = true - logits
    return margins.scatter(1, labels[:, None], float("inf"))


def resolved_loss_params(loss: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The parameters to record for ``loss``: its ``resolved_params()`` where it has one."""
    getter = getattr(loss, "resolved_params", None)
    return dict(getter()) if callable(getter) else dict(given)


def has_trainable_parameters(loss: nn.Module) -> bool:
    return any(p.requires_grad for p in loss.parameters())
