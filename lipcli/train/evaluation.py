"""Evaluation: clean loss/accuracy across processes, and the model file's Lipschitz record."""

from __future__ import annotations

import json
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.train.distributed import DistContext
from lipcli.train.results import Evaluation
from lipcli.lipschitz.promises import BrokenPromiseError, NonFiniteModelError, verify_promises
from lipcli.lipschitz.report import lipschitz_report


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


def lipschitz_record(model: nn.Module, *, estimate: bool = True,
                     inputs: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """The model file's ``lipschitz`` slot.

    Uses :func:`lipcli.lipschitz.report.lipschitz_report` (guaranteed upper bound + power
    estimate), after :func:`lipcli.lipschitz.promises.verify_promises` has measured every layer the
    bound counts as 1 by its promise with the trained parameters (at the layer ``inputs``
    recorded by :func:`~lipcli.lipschitz.promises.capture_inputs`, else at random images).  A
    broken promise keeps the trained weights but no guaranteed bound: ``upper_bound`` is
    ``None``, ``upper_bound_label`` says why and ``promise_broken`` holds the error line.
    """

    broken = label = None
    try:
        verify_promises(model, inputs=inputs)
    except BrokenPromiseError as exc:
        broken, label = str(exc), BROKEN_PROMISE_LABEL
    except NonFiniteModelError as exc:
        broken, label = str(exc), NON_FINITE_LABEL
    report = lipschitz_report(model, estimate=estimate, iters=50)
    record = json.loads(json.dumps(report.record(), default=float))
    if broken is not None:
        record.update(upper_bound=None, upper_bound_label=label, promise_broken=broken)
    return record


#: the stored ``upper_bound_label`` when a promise was broken at the end of training
BROKEN_PROMISE_LABEL = "no guaranteed bound: a 1-Lipschitz promise is broken (see promise_broken)"
#: ... and when a layer's output was non-finite (the error line is stored the same way)
NON_FINITE_LABEL = "no guaranteed bound: the model produces non-finite values (see promise_broken)"
