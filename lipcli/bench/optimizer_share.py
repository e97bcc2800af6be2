"""``lip bench train --recipe``: each recipe's own optimiser, timed apart from the step.

The interleaved rows (:mod:`lipcli.bench.recipes`) run one SGD step for every network, so that
the rows compare the networks.  This measures what the recipe's optimiser adds: on each recipe's
network (rebuilt with the same seed) one forward and backward of cross-entropy on a synthetic
batch gives gradients; then the recipe's optimiser (built as ``lip train --recipe`` builds it:
:func:`lipcli.train.optim.build_optimizer` over the run's weight-decay groups, so a manifold
optimiser updates the declared orthogonal parameters on the manifold) and the benchmark's SGD
each take ``steps`` steps on those gradients after ``warmup`` untimed ones, interleaved; the
medians are reported.  The optimiser's share of a step is

    share = t_opt / (t_step - t_sgd + t_opt)

with ``t_step`` the row's median SGD training step: forward and backward as timed, with the
recipe's optimiser in place of SGD (autocast and the recipe's loss are not part of it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from lipcli.bench.compare import _build
from lipcli.bench.inputs import Progress, _no_progress
from lipcli.bench.reports.components import OptimizerTiming, VariantRow
from lipcli.bench.step import _sync, recipe_optimizer, synthetic_batch

__all__ = ["time_recipe_optimizers"]


def _timed_step(optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    optimizer.step()
    _sync(device)
    return time.perf_counter() - t0


def time_recipe_optimizers(rows: Sequence[VariantRow], specs: Sequence[Any], *, width: int, num_classes: int,
                           seed: int, batch_size: int, steps: int, warmup: int, device: torch.device,
                           progress: Progress = _no_progress) -> None:
    """Set ``row.optimizer`` of each recipe row (``rows[i]`` is recipe ``specs[i]``'s network)."""
    from lipcli.host.recipes import new_settings
    from lipcli.train.config import TrainConfig
    from lipcli.train.optim import build_optimizer, weight_decay_groups

    gen = torch.Generator().manual_seed(seed + 1)
    for row, spec in zip(rows, specs):
        cfg = new_settings(TrainConfig(), recipe=spec.label, given={"warmup_epochs": 0.0})
        progress(f"{row.label}: timing its optimiser ({cfg.optimizer}) against SGD")
        model = _build("", row.components, width, num_classes, seed, device).train()
        x, y = synthetic_batch(batch_size, num_classes, gen, device)
        F.cross_entropy(model(x), y).backward()
        own = build_optimizer(cfg, model, weight_decay_groups(model, cfg.weight_decay))
        sgd = recipe_optimizer(model)
        times: dict[str, list[float]] = {"own": [], "sgd": []}
        for r in range(warmup + steps):
            for name, opt in (("own", own), ("sgd", sgd)) if r % 2 == 0 else (("sgd", sgd), ("own", own)):
                dt = _timed_step(opt, device)
                if r >= warmup:
                    times[name].append(dt)
        t_own, t_sgd = statistics.median(times["own"]), statistics.median(times["sgd"])
        t_step = row.times.median_step_s
        row.optimizer = OptimizerTiming(
            name=str(cfg.optimizer), step_ms=t_own * 1e3, sgd_step_ms=t_sgd * 1e3,
            share=t_own / max(t_step - t_sgd + t_own, 1e-12))
        del model, own, sgd
