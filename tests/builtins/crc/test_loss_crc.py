"""The CRC-Lip training loss's pieces (lipcli.builtins.crc.loss): the feature attack and the
curvature penalty against exact eigenvalues (moved here with the code from tests/test_train.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli.builtins.crc.loss import CurvaturePenalty, FeatureAttack


class _MLP(torch.nn.Module):
    def __init__(self, d=6, h=9, c=4):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, c)

    def forward(self, y):
        return self.fc2(F.softplus(self.fc1(y)))


def test_feature_attack_stays_in_the_ball_and_lowers_the_margin():
    torch.manual_seed(0)
    head = _MLP(d=8, h=32, c=5)
    y = torch.randn(64, 8)
    labels = head(y).argmax(dim=1)
    attack = FeatureAttack(radius=0.5, steps=5)
    assert attack.step_size == pytest.approx(1.5 * 0.5 / 5)
    delta = attack(head, y, labels)
    assert not delta.requires_grad
    assert float(delta.norm(dim=1).max()) <= 0.5 * (1 + 1e-5)

    def min_margin(z):
        logits = head(z)
        true = logits.gather(1, labels[:, None])
        return (true - logits).scatter(1, labels[:, None], float("inf")).min(dim=1).values

    with torch.no_grad():
        clean, adv = min_margin(y), min_margin(y + delta)
        rand = torch.randn_like(y)
        rand = 0.5 * rand / rand.norm(dim=1, keepdim=True)
        random_dir = min_margin(y + rand)
    assert float((adv - clean).mean()) < float((random_dir - clean).mean()) - 1e-3
    assert bool((adv <= clean + 1e-5).float().mean() > 0.9)


def exact_bounds(head: _MLP) -> torch.Tensor:
    """Exact max(m, M) per ordered pair (float64 eigenvalues), SPEC §4."""
    w1, w2 = head.fc1.weight.double(), head.fc2.weight.double()
    c = w2.shape[0]
    out = torch.zeros(c, c, dtype=torch.float64)
    for l in range(c):
        for j in range(c):
            if l == j:
                continue
            d = w2[l] - w2[j]
            big = 0.25 * torch.linalg.eigvalsh(w1.t() @ torch.diag(d.clamp_min(0)) @ w1).max()
            small = 0.25 * torch.linalg.eigvalsh(w1.t() @ torch.diag((-d).clamp_min(0)) @ w1).max()
            out[l, j] = max(big, small)
    return out


def test_curvature_penalty_lower_estimate_converges_and_has_gradients():
    torch.manual_seed(1)
    head = _MLP(d=6, h=12, c=4)
    exact = exact_bounds(head)
    labels = torch.tensor([0, 2, 2, 3])
    few = CurvaturePenalty(6, power_steps=2)
    few.update_u(head, 50)
    many = CurvaturePenalty(6, power_steps=300)
    many.update_u(head, 50)
    per_example_exact = torch.stack([exact[l][torch.arange(4) != l].mean() for l in labels.tolist()])
    approx_few = few(head, labels)
    approx_many = many(head, labels)
    assert approx_few.shape == (4,)
    # Rayleigh quotients never exceed the largest eigenvalue; enough steps reach it
    assert bool((approx_few.double() <= per_example_exact * (1 + 1e-5)).all())
    assert torch.allclose(approx_many.double(), per_example_exact, rtol=1e-3)
    loss = approx_few.mean()
    loss.backward()
    assert head.fc1.weight.grad is not None and head.fc1.weight.grad.abs().sum() > 0
    assert head.fc2.weight.grad is not None and head.fc2.weight.grad.abs().sum() > 0
    # top-k mode: only the k highest other logits per example
    topk = CurvaturePenalty(6, power_steps=300, other_classes=1)
    topk.update_u(head, 50)
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]] * 4)
    got = topk(head, labels, logits)
    expected = torch.stack([exact[l, 1 if l != 1 else 3] for l in labels.tolist()])
    assert torch.allclose(got.double(), expected, rtol=1e-3)
