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

* ``begin_epoch(progress)``: called once before every epoch with a :class:`TrainProgress`
  (the 0-based epoch, the number of epochs, the global step, the steps per epoch), e.g. for a
  schedule of the loss's parameters (:class:`EpsSchedule`); a value that a step reads must
  be updated in place in a buffer (a CUDA graph replays the step with the buffers it
  captured);
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


@dataclass(frozen=True)
class TrainProgress:
    """Where training stands when an epoch begins (``begin_epoch``): ``epoch`` (0-based) of
    ``epochs``, ``step`` (optimiser steps done so far) and ``steps_per_epoch``."""

    epoch: int
    epochs: int
    step: int = 0
    steps_per_epoch: int = 0


@dataclass(frozen=True)
class EpsSchedule:
    """The radius ramp of LiResNet's EMMA and BRONet's Logit Annealing: in epoch ``e`` (0-based)
    of ``E``, ``ε(e) = ε · (min + (max − min) · min(e / E / ramp, 1))``, i.e. from ``min·ε`` to
    ``max·ε`` linearly over the first ``ramp`` fraction of the epochs, then ``max·ε``
    (``ramp = 0``: ``max·ε`` from the start).  ``min = max = 1`` is the constant ``ε``."""

    eps: float
    min: float = 1.0
    max: float = 1.0
    ramp: float = 0.5

    @property
    def constant(self) -> bool:
        return self.min == 1.0 and self.max == 1.0

    def at(self, epoch: int, epochs: int) -> float:
        """``ε`` in epoch ``epoch`` (0-based) of ``epochs``."""
        ratio = 1.0 if self.ramp <= 0 or epochs <= 0 else min(epoch / epochs / self.ramp, 1.0)
        return self.eps * (self.min + (self.max - self.min) * ratio)


def eps_schedule_params() -> tuple[Any, ...]:
    """The ``Param`` declarations of an :class:`EpsSchedule` (``min_eps``, ``max_eps``, ``ramp``)
    for a loss spec; the defaults keep ``ε`` fixed."""
    from lipcli.sdk.specs import Param

    return (
        Param(name="min_eps", type=float, default=1.0, min=0.0, max=1e3,
              help="eps multiple at the start of the ramp (1 with max_eps=1: fixed eps)"),
        Param(name="max_eps", type=float, default=1.0, min=0.0, max=1e3,
              help="eps multiple at the end of the ramp and after it"),
        Param(name="ramp", type=float, default=0.5, min=0.0, max=1.0,
              help="fraction of the epochs over which eps ramps from min_eps to max_eps"),
    )


def check_eps_schedule(eps: float, min_eps: float, max_eps: float, ramp: float) -> EpsSchedule:
    """An :class:`EpsSchedule`, or ``ValueError`` naming the bad value."""
    for name, value in (("min_eps", min_eps), ("max_eps", max_eps)):
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if not 0 <= ramp <= 1:
        raise ValueError(f"ramp must be in [0, 1], got {ramp}")
    return EpsSchedule(float(eps), float(min_eps), float(max_eps), float(ramp))


class EpsRamp(nn.Module):
    """The ``ε`` a margin loss uses now, following an :class:`EpsSchedule` (call
    :meth:`begin_epoch` from the loss's ``begin_epoch``).  :meth:`value` is the float ``ε``
    when the schedule is constant, else a 0-dim float64 buffer (not persistent: it is a
    function of the epoch) updated in place, so that a step replayed from a CUDA graph reads
    the current value.  Before the first ``begin_epoch`` it holds epoch 0's value."""

    def __init__(self, schedule: EpsSchedule) -> None:
        super().__init__()
        self.schedule = schedule
        self.register_buffer("current", torch.tensor(schedule.at(0, 1), dtype=torch.float64),
                             persistent=False)

    def begin_epoch(self, progress: TrainProgress) -> None:
        self.current.fill_(self.schedule.at(progress.epoch, progress.epochs))

    def value(self) -> float | torch.Tensor:
        return self.schedule.eps if self.schedule.constant else self.current

    def params(self) -> dict[str, float]:
        s = self.schedule
        return {"eps": s.eps, "min_eps": s.min, "max_eps": s.max, "ramp": s.ramp}


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


# ---------------------------------------------------------------------------------------------
# Lipschitz constants of logit differences, for margin losses (EMMA, logit annealing)
# ---------------------------------------------------------------------------------------------
#: relative tolerance of :func:`check_affine_head`
AFFINE_RTOL = 1e-4


def feature_lipschitz(model: nn.Module, context: LossContext) -> torch.Tensor | float:
    """``Lip(g)`` of the feature map as a training loss sees it: the architecture's
    ``lipschitz_training_estimate()`` (a differentiable ESTIMATE, e.g. power iteration on
    residual blocks) when it has one, else ``context.input_lipschitz`` (every layer after the
    normalisation 1-Lipschitz, as in LipConvnet).  Never a certificate."""
    estimate = getattr(model, "lipschitz_training_estimate", None)
    return estimate() if callable(estimate) else context.input_lipschitz


def affine_head_rows(head: nn.Module, dim: int, *, like: torch.Tensor) -> torch.Tensor:
    """``A`` (``(c, dim)``) of an affine head ``h(y) = A y + b``, read off the head as
    ``h(I) − h(0)`` (differentiable in the head's parameters); meaningful only for affine
    heads (:func:`check_affine_head`)."""
    eye = torch.eye(dim, dtype=like.dtype, device=like.device)
    basis = head(torch.cat([eye, torch.zeros_like(eye[:1])]))
    return (basis[:-1] - basis[-1:]).t()


def check_affine_head(head: nn.Module, features: torch.Tensor, loss_name: str) -> None:
    """Raise :class:`~lipcli.sdk.errors.LipUsageError` unless ``h(a) + h(b) = h(a + b) + h(0)``
    on the batch (an affine head such as ``lln``)."""
    from lipcli.sdk.errors import LipUsageError

    with torch.no_grad(), torch.autocast(features.device.type, enabled=False):  # --amp: exact float32
        a = at_least_float32(features.detach())
        b = a.roll(1, dims=0)
        zero = torch.zeros_like(a[:1])
        lhs = head(a) + head(b)
        rhs = head(a + b) + head(zero)
        scale = lhs.abs().max().clamp_min(1.0)
        if not bool(((lhs - rhs).abs().max() <= AFFINE_RTOL * scale).item()):
            raise LipUsageError(
                f"loss {loss_name!r} needs an affine head (such as lln); {type(head).__name__} is not affine"
            )


def logit_difference_lipschitz(model: nn.Module, features: torch.Tensor, context: LossContext) -> torch.Tensor:
    """``K[k, j] = ‖a_k − a_j‖₂ · Lip(g)`` (``(c, c)``, differentiable): the Lipschitz constant
    in input space of the logit difference ``f_k − f_j`` of an affine head on a feature map
    with Lipschitz constant ``Lip(g)`` (:func:`feature_lipschitz`: an ESTIMATE during
    training).  ``a_k`` are the head's rows (:func:`affine_head_rows`; for LLN the normalised
    weights).  The diagonal is 0 (its gradient is kept finite)."""
    rows = affine_head_rows(model.head, features.shape[1], like=features)
    sq = (rows * rows).sum(dim=1)
    gram = sq[:, None] + sq[None, :] - 2.0 * rows @ rows.t()
    distance = gram.clamp_min(1e-24).sqrt() * (1.0 - torch.eye(rows.shape[0], dtype=rows.dtype,
                                                                 device=rows.device))
    return distance * feature_lipschitz(model, context)


def emma_logits(logits: torch.Tensor, labels: torch.Tensor, pair_lipschitz: torch.Tensor,
                eps: float | torch.Tensor, min_ratio: float) -> torch.Tensor:
    """The EMMA logits of Hu et al. (NeurIPS 2023): ``f_j − f_l + ρ_j · ε · K_lj`` with
    ``ρ_j = clip((f_l − f_j) / (K_lj ε), min_ratio, 1)`` computed without gradient (``K``: the
    ``(c, c)`` :func:`logit_difference_lipschitz`; the entry of the label ``l`` is 0).  Every
    competing logit is raised by the margin that certification at the radius
    ``ρ_j ε`` needs, i.e. the current certified radius against ``j`` clipped to
    ``[min_ratio·ε, ε]``; the cross-entropy of these logits is the EMMA loss.  ``eps``: a
    float or a 0-dim tensor (:meth:`EpsRamp.value`)."""
    shifted = logits - logits.gather(1, labels[:, None])
    margin = pair_lipschitz[labels]  # (N, c): K_lj
    with torch.no_grad():
        ratio = (-shifted / (margin * eps).clamp_min(1e-8)).clamp(min_ratio, 1.0)
    return shifted + ratio * eps * margin
