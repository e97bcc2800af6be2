"""Training that cannot silently diverge (:class:`DivergenceGuard`).

Before every optimiser step the guard tests the gradients that step would apply (after
clipping).  Where the training loop reads the device every step anyway (eager steps on the
CPU), a non-finite gradient stops the run *before* the optimiser applies it.  On an
accelerator the loop reads the device only every few steps (and a CUDA graph cannot branch
on the host at all), so the test only sets a device flag, read where the loop already reads
the loss (:meth:`DivergenceGuard.read`, all-reduced with it): that step may change the
weights in memory, but the run stops before the epoch's checkpoint, so no checkpoint or
model file ever holds them.  Either way the run directory keeps the checkpoint of the last
epoch whose every step was finite, and :func:`diverged` says how to go on.

With a gradient scaler (float16 autocast) infinite gradients are the scaler's business (it
skips those steps and lowers its scale): the guard then tests the loss only.

In a multi-process run the gradients are averaged over all processes before the test, so
every process sees the same verdict at the same step; the loss test is all-reduced.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from lipcli.train.errors import TrainingDiverged, literal


def grads_finite(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """A 0-d bool tensor on the gradients' device: every gradient of ``params`` is finite
    (parameters without a gradient count as finite; no host synchronisation)."""
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if not grads:
        return torch.ones((), dtype=torch.bool)
    total = getattr(torch.nn.utils, "get_total_norm", None)
    if total is not None:  # one fused reduction per device; max |g| is NaN or inf exactly when some g is
        return torch.isfinite(total(grads, norm_type=math.inf))
    return torch.stack([torch.isfinite(g).all() for g in grads]).all()


class DivergenceGuard:
    """Tests each step's gradients (``check_grads``); ``host``: stop before a non-finite
    step is applied (the loop reads the device every step), else only flag it on the
    device for :meth:`read`."""

    def __init__(self, device: torch.device, *, check_grads: bool, host: bool) -> None:
        self.check_grads, self.host = check_grads, host
        #: a step with a non-finite gradient has run since the last :meth:`read` (device-side)
        self.flag = torch.zeros((), dtype=torch.float64, device=device)
        #: what stopped the run, for the message: "gradient not finite", "loss nan" ...
        self.reason = ""

    def before_step(self, params: list[torch.Tensor], loss: torch.Tensor, run: Any,
                    norm: torch.Tensor | None = None) -> None:
        """Call between backward (and clipping) and the optimiser step of ``run`` (``loss``:
        the step's loss; ``norm``: the gradients' total norm when clipping computed it, so
        it is not reduced twice); raises :class:`TrainingDiverged` on the host path."""
        if not self.check_grads:
            return
        ok = grads_finite(params) if norm is None else torch.isfinite(norm)
        if self.host:
            if not bool(ok):
                self.reason = f"loss {float(loss.detach()):.3g}, gradient not finite"
                raise diverged(run, self.reason, applied=False)
        else:
            self.flag.add_((~ok).to(self.flag.dtype))  # in place: a CUDA graph replays it

    def read(self, loss_sum: torch.Tensor, ctx: Any, run: Any) -> None:
        """At the loop's synchronisation points: all-reduce this rank's summed loss with the
        gradient flag; raise :class:`TrainingDiverged` when either is not finite."""
        checked = torch.stack([loss_sum.reshape(()).double(), self.flag.double()])
        ctx.all_reduce_sum(checked)
        loss, flagged = float(checked[0]), float(checked[1])
        if not math.isfinite(loss) or flagged != 0:
            self.reason = ("gradient not finite" if math.isfinite(loss) else
                           f"loss {'nan' if math.isnan(loss) else 'inf'}")
            raise diverged(run, self.reason, applied=True)


def diverged(run: Any, reason: str, *, applied: bool) -> TrainingDiverged:
    """The error for ``run`` (a :class:`lipcli.train.loop.RunContext`) diverging at its
    current step (``applied``: the loop has already counted it): epoch and step, the learning
    rate, the checkpoint kept and what to do."""
    state, settings = run.state, run.settings
    steps = run.loaders.steps_per_epoch
    epoch, step = state.epoch + 1, state.step - state.epoch * steps + (0 if applied else 1)
    run_dir = literal(settings.paths.run_dir)
    error = TrainingDiverged(
        f"training diverged at epoch {epoch} step {step} ({reason}, lr "
        f"{run.optim.scheduler.get_last_lr()[0]:.3g}); the last finite checkpoint (after epoch "
        f"{state.epoch}) is kept in {run_dir}: resume it with a lower {{lr}}, "
        f"`{{command}} {{resume}} {run_dir} {{lr}} LR`, or start again with a recipe's settings",
        launch=None if settings.ctx.world_size == 1 else settings.ctx.local_world_size,
        launcher=settings.ctx.launcher,
    )
    error.silent = not settings.ctx.is_main  # every rank stops at the same step: rank 0 says it
    return error


def load_keeping_lr(optimizer: Any, scheduler: Any, optimizer_state: dict[str, Any],
                    scheduler_state: dict[str, Any]) -> None:
    """Load a checkpoint's optimiser and schedule state into ones built with (perhaps) another
    learning rate (``lr`` given on resume, e.g. a lower one after a divergence): every stored
    rate (the current one, the initial one and the schedule's base) is scaled by new / stored,
    so the schedule goes on from where it was at the new rate.  The same rate loads exactly."""
    built = [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
    groups = optimizer.param_groups
    stored = [float(g.get("initial_lr", g["lr"])) for g in groups]
    if built == stored:
        return
    last = getattr(scheduler, "_last_lr", None)
    for i, (group, new, old) in enumerate(zip(groups, built, stored)):
        factor = new / old
        group["lr"] = float(group["lr"]) * factor
        if "initial_lr" in group:
            group["initial_lr"] = new
        scheduler.base_lrs[i] = float(scheduler.base_lrs[i]) * factor
        if last is not None and i < len(last):
            last[i] = float(last[i]) * factor
