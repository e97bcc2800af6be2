"""The generic ``margin`` certificate: the formula, its rounding, soundness against exact
distances (linear heads) and feature-space PGD (a nonlinear head), the LLN certificate where
both apply, heads without a bound, and the top-k heuristic label."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import lipcli_ortho_head.plugin as plugin
from lipcli.sdk.errors import LipError
from lipcli.numerics.spectral import spectral_norm_upper_bound
from lipcli.sdk.specs import ONE_LIPSCHITZ
from lipcli.testing import check_component_spec, plugin_registry
from lipcli_ortho_head import MarginCertifier, OrthoHead


class BoundedLinear(nn.Module):
    """A plain linear head declaring the guaranteed bound of its weight."""

    def __init__(self, d: int, c: int, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(torch.randn(c, d, generator=gen))
        self.bias = nn.Parameter(torch.randn(c, generator=gen))

    def forward(self, y):
        return nn.functional.linear(y, self.weight.to(y.dtype), self.bias.to(y.dtype))

    def lipschitz_upper_bound(self) -> float:
        return spectral_norm_upper_bound(self.weight.detach().double(), rtol=1e-9)


class TwoLayer(nn.Module):
    """A nonlinear head ``W2 tanh(W1 y) + b``, bound ``||W2|| ||W1||`` (tanh is 1-Lipschitz)."""

    def __init__(self, d: int, c: int, hidden: int = 12, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, c)

    def forward(self, y):
        return self.fc2(torch.tanh(self.fc1(y)))

    def lipschitz_upper_bound(self) -> float:
        a = spectral_norm_upper_bound(self.fc1.weight.detach().double(), rtol=1e-9)
        b = spectral_norm_upper_bound(self.fc2.weight.detach().double(), rtol=1e-9)
        return math.nextafter(a * b, math.inf)


def lln_radius(head, features):
    """``(predictions, radii)`` of the built-in ``lln`` certificate: the exact distances of a
    linear head's decision boundaries, in float64 and rounded down."""
    result = plugin_registry().component("certificate", "lln").build().certify(head, features)
    return result.predictions, result.radius


def _certify(head, features, top_k=None):
    cert = MarginCertifier()
    cache = cert.prepare(head)
    return cert.certify(head, features, top_k=top_k), cache


def test_spec():
    spec = plugin.margin_spec()
    check_component_spec(spec)
    assert "sound" in spec.promises


def test_radius_is_the_margin_over_sqrt2_L():
    head = BoundedLinear(6, 4)
    y = torch.randn(50, 6, dtype=torch.float64)
    res, cache = _certify(head, y)
    logits = head(y).detach()
    top2 = logits.topk(2, dim=1).values
    expected = ((top2[:, 0] - top2[:, 1]) / (math.sqrt(2) * head.lipschitz_upper_bound())).clamp_min(0)
    torch.testing.assert_close(res.radius, expected, rtol=1e-9, atol=1e-12)
    assert bool((res.radius <= expected).all())  # rounded down, never up
    assert torch.equal(res.predictions, logits.argmax(1))
    assert cache["method"] == "margin" and cache["head_lipschitz_bound"] == head.lipschitz_upper_bound()


@pytest.mark.parametrize("seed", range(4))
def test_never_beyond_the_exact_distance_of_a_linear_head(seed):
    """For a linear head the exact distance to the decision boundary is the lln radius; the
    margin certificate is a lower bound on it (and the boundary point there flips the
    prediction)."""
    head = BoundedLinear(8, 5, seed=seed)
    y = torch.randn(200, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 2
    res, _ = _certify(head, y)
    pred, exact = lln_radius(head, y)
    assert torch.equal(pred, res.predictions)
    assert bool((res.radius <= exact).all())
    assert float(res.radius.max()) > 0


def test_agrees_with_the_lln_certificate_on_the_ortho_head():
    torch.manual_seed(3)
    head = OrthoHead(32, 10)
    with torch.no_grad():
        head.bias.normal_()
    y = torch.randn(300, 32) * 3
    res, _ = _certify(head, y)
    pred, lln = lln_radius(head, y.double())
    assert torch.equal(pred, res.predictions)
    assert bool((res.radius <= lln * (1 + 1e-12)).all())
    torch.testing.assert_close(res.radius, lln, rtol=1e-6, atol=1e-9)


def _feature_pgd(head, y, labels, eps, steps=60):
    """l2 PGD on the features: smallest-margin direction inside the ball of radius eps."""
    delta = torch.zeros_like(y, requires_grad=True)
    for _ in range(steps):
        logits = head(y + delta)
        other = logits.scatter(1, labels[:, None], float("-inf")).max(1).values
        loss = (other - logits.gather(1, labels[:, None]).squeeze(1)).sum()
        (g,) = torch.autograd.grad(loss, delta)
        with torch.no_grad():
            delta += 0.1 * eps.unsqueeze(1) * g / g.norm(dim=1, keepdim=True).clamp_min(1e-30)
            scale = (eps / delta.norm(dim=1).clamp_min(1e-30)).clamp(max=1.0)
            delta *= scale.unsqueeze(1)
    with torch.no_grad():
        return head(y + delta).argmax(1)


@pytest.mark.parametrize("seed", range(3))
def test_feature_space_attack_finds_no_violation_on_a_nonlinear_head(seed):
    head = TwoLayer(6, 4, seed=seed).double()
    y = torch.randn(256, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    res, _ = _certify(head, y)
    assert float(res.radius.max()) > 0
    inside = _feature_pgd(head, y, res.predictions, 0.999 * res.radius)
    assert torch.equal(inside, res.predictions), "an attack inside a certified radius succeeded"
    # the attack is strong enough to matter: at 30x the certified radius it flips some
    outside = _feature_pgd(head, y, res.predictions, 30 * res.radius + 1e-3)
    assert bool((outside != res.predictions).any())


def test_head_without_a_bound_is_refused_and_a_promise_gives_one():
    head = nn.Linear(4, 3)
    with pytest.raises(LipError, match="neither has lipschitz_upper_bound"):
        MarginCertifier().prepare(head)
    head.lip_promises = (ONE_LIPSCHITZ,)
    res, cache = _certify(head, torch.randn(5, 4))
    assert cache["head_lipschitz_bound"] == 1.0 and cache["head_lipschitz_source"] == "promise"
    assert any("promise" in n for n in res.notes)


def test_invalid_bound_is_refused():
    head = BoundedLinear(4, 3)
    head.lipschitz_upper_bound = lambda: float("nan")
    with pytest.raises(LipError, match="invalid Lipschitz bound"):
        MarginCertifier().prepare(head)


def test_top_k_is_labelled_heuristic():
    head = BoundedLinear(6, 5)
    res, _ = _certify(head, torch.randn(20, 6), top_k=2)
    assert res.exact_classes is False and any("HEURISTIC" in n for n in res.notes)
    full, _ = _certify(head, torch.randn(20, 6), top_k=4)
    assert full.exact_classes is True


def test_a_tie_certifies_nothing():
    head = BoundedLinear(3, 3)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([1.0, 1.0, 0.0]))
        head.weight[0, 0] = 1e-30  # L > 0
    res, _ = _certify(head, torch.zeros(2, 3))
    assert torch.equal(res.radius, torch.zeros(2, dtype=torch.float64))
