"""The ``lln`` certificate: exact distance to the decision boundary of a linear head."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from torch import nn

from lipcli.builtins.lln.certificate import LLNCertifier, lln_radius, pairwise_row_distances
from lipcli.builtins.lln.plugin import lip_certificates
from lipcli.sdk.certificates import Certifier, CertifyResult, head_fingerprint


class PlainLinear(nn.Module):
    """A linear head without row normalisation (the certificate must not assume unit rows)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.bias = nn.Parameter(bias.clone())

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y @ self.weight.T + self.bias


class NormalizedLinear(PlainLinear):
    """Stand-in for the LLN head: rows of ``weight`` normalised in the forward pass."""

    def normalized_weight(self) -> torch.Tensor:
        return self.weight / self.weight.norm(dim=1, keepdim=True)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y @ self.normalized_weight().T + self.bias


def _true_distance(w: np.ndarray, b: np.ndarray, y: np.ndarray) -> float:
    """Distance to {y' : argmax changes}, by SLSQP per competitor (independent of the formula)."""
    logits = w @ y + b
    label = int(np.argmax(logits))
    best = np.inf
    for j in range(w.shape[0]):
        if j == label:
            continue
        cons = {"type": "ineq", "fun": lambda x, j=j: (w[j] - w[label]) @ x + b[j] - b[label]}
        res = minimize(
            lambda x: 0.5 * np.sum((x - y) ** 2),
            y + 0.01,
            jac=lambda x: x - y,
            constraints=[cons],
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 200},
        )
        best = min(best, float(np.linalg.norm(res.x - y)))
    return best


def test_certifier_protocol_and_hook():
    specs = lip_certificates()
    assert [s.name for s in specs] == ["lln"]
    cert = specs[0].factory()
    assert isinstance(cert, Certifier)
    assert cert.name == "lln"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_exact_distance_multiclass(seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    b = torch.randn(5, generator=gen, dtype=torch.float64)
    y = torch.randn(8, 3, generator=gen, dtype=torch.float64) * 2
    head = PlainLinear(w, b)
    cert = LLNCertifier()
    cert.prepare(head)
    res = cert.certify(head, y)
    assert res.exact_classes and res.radius.dtype == torch.float64
    assert torch.equal(res.predictions, (y @ w.T + b).argmax(1))
    for i in range(y.shape[0]):
        truth = _true_distance(w.numpy(), b.numpy(), y[i].numpy())
        # SLSQP meets the constraint only to ~1e-9, so compare to optimiser accuracy; the
        # exact boundary crossing is checked in the next test
        assert res.radius[i].item() == pytest.approx(truth, rel=1e-6, abs=1e-9)


def test_two_class_moving_past_radius_flips_and_inside_does_not():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    b = torch.randn(2, generator=gen, dtype=torch.float64)
    head = NormalizedLinear(w, b)
    y = torch.randn(20, 6, generator=gen, dtype=torch.float64)
    cert = LLNCertifier()
    cert.prepare(head)
    res = cert.certify(head, y)
    what = head.normalized_weight().detach()
    for i in range(y.shape[0]):
        l = int(res.predictions[i])
        j = 1 - l
        direction = (what[j] - what[l]) / (what[j] - what[l]).norm()  # fastest way towards class j
        r = res.radius[i].item()
        assert r > 0
        past = head(y[i] + r * (1 + 1e-7) * direction).detach()
        inside = head(y[i] + r * (1 - 1e-7) * direction).detach()
        assert past.argmax().item() == j
        assert inside.argmax().item() == l
        # and no direction at all flips inside the ball
        dirs = torch.randn(200, 6, generator=gen, dtype=torch.float64)
        dirs = dirs / dirs.norm(dim=1, keepdim=True)
        preds = head(y[i] + r * (1 - 1e-7) * dirs).detach().argmax(1)
        assert bool((preds == l).all())


def test_all_classes_by_default_top_k_is_heuristic():
    """100 classes: the nearest boundary belongs to a class whose logit is NOT in the top 9."""
    gen = torch.Generator().manual_seed(4)
    dim, c = 16, 100
    w0 = torch.randn(dim, generator=gen, dtype=torch.float64)
    w0 = w0 / w0.norm()
    # classes 1..98: rows within 1e-4 of ŵ_0 and logits just below: far boundaries
    w = w0 + 1e-4 * torch.randn(c, dim, generator=gen, dtype=torch.float64)
    w[0] = w0
    b = -0.01 * torch.arange(c, dtype=torch.float64)
    # class 99: the lowest logit, but the opposite row -> the nearest boundary
    w[99] = -w0
    b[99] = -1.0
    y = torch.zeros(1, dim, dtype=torch.float64)
    head = PlainLinear(w, b)
    cert = LLNCertifier()
    cert.prepare(head)
    full = cert.certify(head, y)
    top9 = cert.certify(head, y, top_k=9)
    assert full.exact_classes and not top9.exact_classes
    assert any("HEURISTIC" in n for n in top9.notes)
    expected = (b[0] - b[99]) / (w[0] - w[99]).norm()
    assert full.radius[0].item() == pytest.approx(expected.item(), rel=1e-9)
    assert top9.radius[0] > 10 * full.radius[0]  # the reference's top-9 rule over-claims
    assert full.radius[0].item() == pytest.approx(0.5, rel=1e-12)
    assert cert.certify(head, y, top_k=99).exact_classes


def test_ties_and_negative_margins_give_zero():
    w = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    b = torch.zeros(3, dtype=torch.float64)
    head = PlainLinear(w + torch.tensor([[0.0, 0.0], [0.0, 1e-30], [0.0, 0.0]], dtype=torch.float64), b)
    pred, radius = lln_radius(head.weight.detach(), b, torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    assert radius.item() == 0.0  # f_0 == f_1 at y: nothing is certified


def test_cache_fingerprint_and_json():
    gen = torch.Generator().manual_seed(5)
    head = NormalizedLinear(torch.randn(3, 4, generator=gen), torch.randn(3, generator=gen))
    cert = LLNCertifier()
    cache = cert.prepare(head)
    assert json.loads(json.dumps(cache)) == cache
    assert cache["fingerprint"] == head_fingerprint(head)
    assert cert.prepare(head, cache) is cache
    with torch.no_grad():
        head.bias[0] += 1
    assert cert.prepare(head, cache)["fingerprint"] != cache["fingerprint"]


def test_float32_head_matches_float64_certificate():
    gen = torch.Generator().manual_seed(6)
    w, b = torch.randn(10, 32, generator=gen), torch.randn(10, generator=gen)
    y = torch.randn(50, 32, generator=gen)
    r32 = LLNCertifier().certify(NormalizedLinear(w, b), y)
    r64 = LLNCertifier().certify(NormalizedLinear(w.double(), b.double()), y.double())
    assert isinstance(r32, CertifyResult)
    assert torch.allclose(r32.radius, r64.radius, rtol=1e-5, atol=1e-6)


def test_pairwise_distances_do_not_cancel_for_close_rows():
    """More than 25 classes with nearly equal rows: the distance must not be underestimated."""
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(64, generator=gen, dtype=torch.float64) * 100
    w = base + 1e-9 * torch.randn(40, 64, generator=gen, dtype=torch.float64)
    dist = pairwise_row_distances(w)
    exact = np.linalg.norm(w.numpy()[:, None, :] - w.numpy()[None, :, :], axis=2)
    assert bool((dist.numpy() >= exact).all())
    assert np.allclose(dist.numpy(), exact, rtol=1e-12)
