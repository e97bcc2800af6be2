"""The l2 PGD attack against classifiers whose exact decision boundary is known."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lipcli.certify.pgd import margins, pgd_l2


def _linear(num_classes: int, dim: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(dim, num_classes).double()
    return lin


def _exact_distance(lin: nn.Linear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact l2 distance from x to the decision boundary of the predicted class (no box):
    min_{j != l} (f_l - f_j) / ||w_l - w_j||."""
    with torch.no_grad():
        logits = lin(x)
        pred = logits.argmax(1)
        w = lin.weight
        diff = w[pred][:, None, :] - w[None, :, :]  # [B, c, D]
        gap = logits.gather(1, pred[:, None]) - logits
        dist = gap / diff.norm(dim=2).clamp_min(1e-30)
        dist = dist.scatter(1, pred[:, None], float("inf"))
        return dist.min(1).values, pred


@pytest.mark.parametrize("num_classes", [2, 7])
def test_pgd_finds_linear_boundary_just_above_exact_distance(num_classes: int) -> None:
    dim = 20
    lin = _linear(num_classes, dim, seed=num_classes)
    x = torch.randn(32, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    dist, pred = _exact_distance(lin, x)
    above = pgd_l2(lin, x, pred, dist * 1.001, steps=60, restarts=2, clip=None)
    assert bool(above.success.all()), "PGD must cross a linear boundary at 1.001 x distance"
    assert bool((above.distance <= dist * 1.001 * (1 + 1e-9)).all())
    # the adversarial points really are misclassified and inside the ball
    with torch.no_grad():
        assert bool((margins(lin(above.adversarial), pred) < 0).all())
    below = pgd_l2(lin, x, pred, dist * 0.999, steps=60, restarts=2, clip=None)
    assert not bool(below.success.any()), "no attack can succeed below the exact distance"
    # it gets close to the boundary: remaining margin is tiny relative to the clean one
    with torch.no_grad():
        clean = margins(lin(x), pred)
    assert bool((below.margin <= clean * 0.01).all())


def test_pgd_respects_ball_and_box() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 5))
    x = torch.rand(16, 3, 4, 4)
    labels = torch.randint(0, 5, (16,))
    eps = torch.linspace(0.0, 2.0, 16)
    res = pgd_l2(model, x, labels, eps, steps=10, restarts=3)
    assert bool((res.distance <= eps.double() * (1 + 1e-5) + 1e-7).all())
    assert float(res.adversarial.min()) >= 0.0 and float(res.adversarial.max()) <= 1.0
    with torch.no_grad():
        m = margins(model(res.adversarial), labels)
    torch.testing.assert_close(m, res.margin)
    assert torch.equal(res.success, res.margin < 0)
    # eps = 0: the attack cannot move, its result is the clean input
    assert torch.equal(res.adversarial[0], x[0])


def test_pgd_targeted_and_untargeted_losses_agree_on_two_classes() -> None:
    lin = _linear(2, 10, seed=3).float()
    x = torch.randn(8, 10)
    with torch.no_grad():
        pred = lin(x).argmax(1)
    for loss in ("margin", "runner-up", "nearest"):
        res = pgd_l2(lin, x, pred, 100.0, steps=20, restarts=1, loss=loss, clip=None)
        assert bool(res.success.all())


def test_pgd_rejects_bad_arguments() -> None:
    lin = _linear(3, 4, seed=0)
    x = torch.zeros(2, 4, dtype=torch.float64)
    y = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError):
        pgd_l2(lin, x, y, -1.0)
    with pytest.raises(ValueError):
        pgd_l2(lin, x, y, 1.0, loss="nope")  # type: ignore[arg-type]
