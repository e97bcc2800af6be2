"""Training to a wall-clock budget (``lip train --time-budget 2h``), as the comparison study of
Prach et al. (CVPR 2024) fixed its epochs: measure the time of a training step first, then
``epochs = ⌊budget / (step time × steps per epoch)⌋`` and build the schedule for those epochs
(the study's ``epoch_budget_estimator.py``: SGD steps with the real data loader, the mean of
the last half of the timed steps, ``int(budget / time per epoch)``); a warm-up keeps its share
of the configured epochs (``--warmup-epochs 20`` of ``--epochs 800`` warms up for 2.5 % of the
planned epochs: lipcli's rule; the study's one-cycle schedule is defined by fractions anyway).

* The measurement trains a *copy* of the model with the run's own step, built afresh for the
  copy (:class:`lipcli.train.parts.Optimization`: the run's optimiser, schedule, loss,
  autocast dtype, gradient scaler and clipping; the run's model, optimiser and random state
  untouched), on the run's training loader: :data:`WARMUP_STEPS` untimed steps, then
  :data:`TIMED_STEPS` timed ones (fewer when an epoch is shorter); evaluation is not part of
  it, as in the study.  (An SGD float32 copy, as before, mis-timed steps whose optimiser or
  precision differ: a manifold optimiser with bf16 autocast, for one.)
* The model file records the plan in its config (``time_budget``, ``budget``: the budget and
  measured epoch time in seconds, the steps timed, the epochs fixed) and the training record
  the epochs run and whether the budget stopped the run.
* Resume keeps the budget honest: the epochs and the schedule are the first measurement's (a
  resumed run never measures again and cannot change ``time_budget``), and the training time of
  earlier sessions counts: the run stops after the epoch in which the accumulated training
  time reached the budget (``stopped_on_budget``), even if the planned epochs are not done.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import time
from typing import Any

import torch

__all__ = ["parse_duration", "measure_step_seconds", "plan_budget", "budget_exhausted", "budget_record",
           "WARMUP_STEPS", "TIMED_STEPS", "MAX_BUDGET_S"]

WARMUP_STEPS, TIMED_STEPS = 2, 20
#: a budget longer than a year can only be a typo
MAX_BUDGET_S = 366 * 86400.0
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_duration(text: str) -> float:
    """Seconds of ``"90s"``, ``"10m"``, ``"2h"``, ``"1h30m"``, ``"1.5h"`` or a bare number of
    seconds; ``ValueError`` for anything else, zero or more than a year."""
    s = str(text).strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        seconds = float(s)
    else:
        parts = _PART.findall(s)
        if not parts or "".join(n + u for n, u in parts) != s:
            raise ValueError(f"not a duration: {text!r} (e.g. 90s, 10m, 2h, 1h30m)")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_BUDGET_S):
        raise ValueError(f"a time budget must be positive and at most a year, got {text!r}")
    return seconds


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_step_seconds(run: Any) -> tuple[float, int]:
    """``(mean seconds of the last half of the timed steps, steps timed)`` for one training step
    (data loading included) of a copy of ``run.model`` with the run's own step (module docstring)."""
    settings, cfg = run.settings, run.settings.cfg
    device = settings.device
    cpu_state = torch.random.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    times: list[float] = []
    spe = run.loaders.steps_per_epoch
    wanted = WARMUP_STEPS + min(TIMED_STEPS, max(2, spe))
    # the schedule of the configured epochs, long enough for the steps timed
    timed = dataclasses.replace(settings, cfg=dataclasses.replace(cfg, epochs=max(cfg.epochs, -(-wanted // spe))))
    try:
        model = copy.deepcopy(run.model).train()
        optim = type(run.optim).build(timed, run.data, model, run.optim.loss_component, spe)  # the run's kind
        optimizer, scaler = optim.optimizer, optim.scaler
        params = [p for p in model.parameters() if p.requires_grad]
        done, prev = 0, None
        while done < wanted:
            for images, labels in run.loaders.train:
                images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=optim.amp_dtype, enabled=cfg.amp):
                    loss, _, _ = optim.step_module(images, labels)
                scaler.scale(loss).backward()
                if cfg.grad_clip:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                optim.scheduler.step()
                _sync(device)
                now = time.perf_counter()
                if done >= WARMUP_STEPS - 1:
                    if prev is not None:
                        times.append(now - prev)
                    prev = now
                done += 1
                if done >= wanted:
                    break
    finally:
        torch.random.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
    half = times[len(times) // 2:] or times
    return sum(half) / len(half), len(times)


def plan_budget(run: Any) -> Any:
    """The run's config with ``epochs`` fixed from the measured epoch time and the ``budget``
    record (module docstring); the caller rebuilds the schedule from it."""
    cfg = run.settings.cfg
    budget = parse_duration(cfg.time_budget)
    step_s, timed = measure_step_seconds(run)
    epoch_s = step_s * run.loaders.steps_per_epoch
    epochs = max(1, int(budget / max(epoch_s, 1e-9)))
    from lipcli.train.config import MAX_EPOCHS

    epochs = min(epochs, MAX_EPOCHS)
    # the warm-up keeps its share of the schedule (a recipe's 20 of 800 epochs: 2.5 % of the run)
    warmup = min(float(epochs), cfg.warmup_epochs * epochs / cfg.epochs)
    record = {"budget_s": budget, "epoch_s": round(epoch_s, 6), "step_s": round(step_s, 6),
              "steps_timed": timed, "steps_per_epoch": run.loaders.steps_per_epoch, "epochs": epochs,
              "warmup_epochs": round(warmup, 6)}
    return dataclasses.replace(cfg, epochs=epochs, warmup_epochs=warmup, budget=record)


def budget_exhausted(cfg: Any, elapsed_s: float) -> bool:
    """Whether the accumulated training time has reached the budget (checked after each epoch)."""
    if not cfg.time_budget:
        return False
    return elapsed_s >= parse_duration(cfg.time_budget)


def budget_record(cfg: Any, state: Any) -> dict[str, Any] | None:
    """The training record's ``time_budget``: the plan, the training time used, the epochs run,
    and whether the budget stopped the run before the planned epochs."""
    if not cfg.time_budget:
        return None
    return {**cfg.budget, "time_budget": cfg.time_budget, "train_time_s": round(state.elapsed, 3),
            "epochs_run": state.epoch, "stopped_on_budget": state.epoch < cfg.epochs}
