"""Evaluation: clean loss/accuracy across processes, and the model file's Lipschitz record."""

from __future__ import annotations

import json
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.train.distributed import DistContext
from lipcli.train.results import Evaluation


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, ctx: DistContext) -> Evaluation:
    """Clean loss and accuracy over every process's shard (summed across processes)."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=ctx.device)
    for images, labels in loader:
        images = images.to(ctx.device, non_blocking=True)
        labels = labels.to(ctx.device, non_blocking=True)
        logits = model(images).float()
        sums[0] += F.cross_entropy(logits, labels, reduction="sum").double()
        sums[1] += (logits.argmax(dim=1) == labels).sum()
        sums[2] += labels.numel()
    ctx.all_reduce_sum(sums)
    model.train(was_training)
    n = max(float(sums[2]), 1.0)
    return Evaluation(loss=float(sums[0]) / n, accuracy=float(sums[1]) / n, examples=int(sums[2]))


def lipschitz_record(model: nn.Module, *, estimate: bool = True) -> dict[str, Any]:
    """The model file's ``lipschitz`` slot.

    Uses :func:`lipcli.host.lipschitz.lipschitz_report` (guaranteed upper bound + power estimate).
    """
    from lipcli.host.lipschitz import lipschitz_report

    report = lipschitz_report(model, estimate=estimate, iters=50)
    return json.loads(json.dumps(report.record(), default=float))
