"""The optional PGD check of a certification run (see the package docstring): every point
certified at ``eps`` is attacked at ``eps``; a success within its certified radius is a
SOUNDNESS VIOLATION."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lipcli.certify.data import batches, stack
from lipcli.certify.options import CertifyOptions
from lipcli.certify.results import AttackInfo, RadiusRow, Violation
from lipcli.certify.steps import Progress
from lipcli.certify.pgd import pgd_l2


def attack_radii(
    model: nn.Module,
    dataset: Any,
    predictions: torch.Tensor,
    correct: torch.Tensor,
    radius: torch.Tensor,
    options: CertifyOptions,
    rows: list[RadiusRow],
    device: torch.device,
    report: Progress,
) -> tuple[list[Violation], AttackInfo]:
    """PGD at every radius; fills the PGD columns of ``rows`` in place."""
    for p in model.parameters():
        p.requires_grad_(False)
    n = predictions.shape[0]
    broken = torch.zeros(n, dtype=torch.bool)  # attack succeeded at some smaller radius
    violations: list[Violation] = []
    for row in rows:
        eps = row.radius
        target = (~broken) & (correct | (radius >= eps))
        idx = target.nonzero().squeeze(1).tolist()
        stage = f"attack eps={row.radius_units:g}"
        # progress in PGD steps of single points: a bar with a useful ETA even for one batch
        per_point = options.attack_steps * options.attack_restarts
        total = len(idx) * per_point
        report(stage, 0, total)
        for bstart, bstop in batches(len(idx), options.batch_size):
            chunk = idx[bstart:bstop]
            images, _ = stack(dataset, chunk)
            images = images.to(device)
            preds = predictions[chunk].to(device)
            res = pgd_l2(
                model, images, preds, eps, steps=options.attack_steps,
                restarts=options.attack_restarts, seed=options.seed + bstart,
                on_step=lambda k, base=bstart * per_point, size=bstop - bstart: report(
                    stage, base + k * size, total),
            )
            success = res.success.cpu()
            dist = res.distance.cpu()
            for j, i in enumerate(chunk):
                if not bool(success[j]):
                    continue
                broken[i] = True
                if float(dist[j]) <= float(radius[i]):
                    violations.append(Violation(
                        index=i, radius=eps, certified_radius=float(radius[i]),
                        attack_distance=float(dist[j]), margin=float(res.margin[j]),
                    ))
            report(stage, bstop * per_point, total)
        row.attacked = len(idx)
        row.empirical_robust_accuracy = int((correct & ~broken).sum()) / n
        row.violations = sum(1 for v in violations if v.radius == eps)
    info = AttackInfo(
        steps=options.attack_steps, restarts=options.attack_restarts, norm="l2", box=[0.0, 1.0],
        violations=len(violations), violation_examples=violations[:5],
    )
    return violations, info
