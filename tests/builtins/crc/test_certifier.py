"""The ``crc-lip`` certifier (lipcli.builtins.crc.certifier): soundness against attacks,
tightness, closed form vs dual, caches, chunking."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from torch import nn

from crc_helpers import MLP
from lipcli.builtins.crc.certifier import CRCCertifier
from lipcli.sdk.certificates import CertifyResult, head_fingerprint


def _numpy_head(head: nn.Module):
    w1, b1 = head.fc1.weight.detach().numpy(), head.fc1.bias.detach().numpy()
    w2, b2 = head.fc2.weight.detach().numpy(), head.fc2.bias.detach().numpy()
    return lambda y: w2 @ np.logaddexp(0.0, w1 @ y + b1) + b2


def _attack_upper_bound(head: nn.Module, y: np.ndarray, label: int, starts: int, rng) -> float:
    """Smallest ‖x - y‖ over points x that provably leave class ``label`` (SLSQP + a ray push)."""
    h = _numpy_head(head)
    best = math.inf
    for j in range(head.fc2.out_features):
        if j == label:
            continue
        gfun = lambda x, j=j: h(x)[label] - h(x)[j]  # noqa: E731
        for _ in range(starts):
            x0 = y + rng.standard_normal(y.shape) * rng.uniform(0.1, 3.0)
            res = minimize(
                lambda x: 0.5 * np.sum((x - y) ** 2),
                x0,
                jac=lambda x: x - y,
                constraints=[{"type": "ineq", "fun": lambda x: -gfun(x)}],
                method="SLSQP",
                options={"maxiter": 300, "ftol": 1e-13},
            )
            x = res.x
            # push along the ray until the point is certainly on the other side (g <= 0)
            for k in range(60):
                s = 1 + 1e-10 * 2**k
                if gfun(y + s * (x - y)) <= 0:
                    best = min(best, s * float(np.linalg.norm(x - y)))
                    break
    return best


def _random_inputs(n: int, dim: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=gen, dtype=torch.float64) * scale


def _certified(head: nn.Module, y: torch.Tensor, **params):
    """``(certifier, its cache, its result on y)`` for a fresh certifier with ``params``."""
    cert = CRCCertifier(**params)
    cache = cert.prepare(head)
    return cert, cache, cert.certify(head, y)


# ------------------------------------------------------------------------------------------
# curvature bounds
# ------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------
# soundness against attacks, closed form vs dual
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dim,hidden,classes,scale,seed", [(3, 8, 3, 4.0, 0), (4, 10, 3, 2.5, 1), (2, 6, 3, 8.0, 2)]
)
def test_certificate_below_true_distance_large_curvature(dim, hidden, classes, scale, seed):
    head = MLP(dim, hidden, classes, scale=scale, seed=seed)
    y = _random_inputs(8, dim, seed)
    res = CRCCertifier().certify(head, y)  # prepares itself
    res_fast = CRCCertifier(dual=False, curvature="lazy").certify(head, y)
    rng = np.random.default_rng(seed)
    ratios = []
    for i in range(y.shape[0]):
        upper = _attack_upper_bound(head, y[i].numpy(), int(res.predictions[i]), 8, rng)
        r = res.radius[i].item()
        assert r <= upper * (1 - 1e-12) or r == 0.0, (i, r, upper)
        assert res_fast.radius[i].item() <= upper
        ratios.append(r / upper)
    assert np.median(ratios) > 0.9  # and it is not vacuous: most certificates are (near) exact


def test_closed_form_never_beats_dual():
    head = MLP(4, 10, 4, scale=3.0, seed=3)
    y = _random_inputs(30, 4, 3)
    dual = CRCCertifier(curvature="exact")
    cache = dual.prepare(head)
    fast = CRCCertifier(curvature="exact", dual=False)
    fast.prepare(head, cache)
    r_dual = dual.certify(head, y).radius
    r_fast = fast.certify(head, y).radius
    assert bool((r_dual >= r_fast).all())
    assert bool((r_dual > r_fast * (1 + 1e-3)).any())  # the dual really helps somewhere


def _pgd_worst_margin(head: nn.Module, y: torch.Tensor, labels: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Largest ``max_{j != l} h_j - h_l`` found in the balls by projected gradient ascent."""
    gen = torch.Generator().manual_seed(0)
    restarts = 32
    rad = radius.repeat_interleave(restarts).unsqueeze(1)
    lab = labels.repeat_interleave(restarts)
    centre = y.repeat_interleave(restarts, dim=0)
    delta = torch.randn(centre.shape, generator=gen, dtype=torch.float64)
    delta = delta / delta.norm(dim=1, keepdim=True) * rad * torch.rand(rad.shape, generator=gen, dtype=torch.float64)
    rows = torch.arange(centre.shape[0])
    worst = torch.full((centre.shape[0],), -math.inf, dtype=torch.float64)
    for _ in range(120):
        delta.requires_grad_(True)
        out = head(centre + delta)
        other = out.clone()
        other[rows, lab] = -math.inf
        obj = other.max(dim=1).values - out[rows, lab]  # > 0: the prediction changed
        worst = torch.maximum(worst, obj.detach())
        (grad,) = torch.autograd.grad(obj.sum(), delta)
        with torch.no_grad():
            delta = delta + 0.08 * rad * grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-300)
            delta = delta * (rad / delta.norm(dim=1, keepdim=True)).clamp(max=1.0)
    return worst.view(-1, restarts).amax(dim=1)


def test_no_certified_point_broken_by_pgd():
    head = MLP(4, 16, 4, scale=3.0, seed=4)
    y = _random_inputs(12, 4, 4)
    res = CRCCertifier().certify(head, y)
    keep = res.radius > 0
    assert int(keep.sum()) >= 10
    inside = _pgd_worst_margin(head, y[keep], res.predictions[keep], res.radius[keep] * (1 - 1e-6))
    assert bool((inside < 0).all())
    # the attack is strong: 5 % beyond the (mostly exact) certificates it does flip most inputs
    outside = _pgd_worst_margin(head, y[keep], res.predictions[keep], res.radius[keep] * 1.05)
    assert int((outside > 0).sum()) >= int(keep.sum()) // 2


# ------------------------------------------------------------------------------------------
# tightness where the dual is exact
# ------------------------------------------------------------------------------------------


def _one_dim_head(threshold: float) -> nn.Module:
    """g depends on y only through 2·y₀ + 0.3: the decision boundary is a hyperplane.

    Unit 0 carries the class difference (d₀ = 1.5); units 1, 2 have equal outgoing weights for
    both classes, so they change both logits equally and never the decision.
    """
    head = MLP(4, 3, 2, seed=5)
    with torch.no_grad():
        head.fc1.weight[0] = torch.tensor([2.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        head.fc1.bias[0] = 0.3
        head.fc2.weight[:, 1:] = head.fc2.weight[0, 1:]
        head.fc2.weight[0, 0] = 1.0
        head.fc2.weight[1, 0] = -0.5
        sp_t = math.log1p(math.exp(threshold))
        head.fc2.bias[0] = 0.0
        head.fc2.bias[1] = 1.5 * sp_t  # g₀₁ = 1.5 (σ(z₀) - σ(threshold))
    return head


def test_exact_distance_one_dimensional_boundary():
    threshold = 0.2
    head = _one_dim_head(threshold)
    gen = torch.Generator().manual_seed(6)
    y = torch.randn(40, 4, generator=gen, dtype=torch.float64) * 0.3
    res = CRCCertifier().certify(head, y)
    z0 = 2 * y[:, 0] + 0.3
    truth = (z0 - threshold).abs() / 2
    assert torch.equal(res.predictions, (z0 <= threshold).long())
    assert bool((res.radius <= truth).all())
    close = truth < 0.6  # where η*·m < 1, the concave side is exact too
    assert torch.allclose(res.radius[close], truth[close], rtol=1e-6, atol=1e-9)
    assert int(close.sum()) >= 25
    # the closed form is exact only on the convex side (class 0: m = 0, K = 0)
    r_fast = CRCCertifier(dual=False).certify(head, y).radius
    assert bool((r_fast <= truth * (1 + 1e-12)).all())


def test_nearly_linear_head_matches_linear_distance():
    """Softplus units far in their linear regime: the radius is the hyperplane distance.

    (The curvature bound ¼λ_max(W₁ᵀdiag(d⁻)W₁) is global, so the dual is exact only while
    η*·m < 1, i.e. for distances that are not huge: the inputs are placed near the boundary.)
    """
    head = MLP(6, 20, 2, seed=7)
    with torch.no_grad():
        head.fc1.bias.fill_(30.0)  # σ(z) = z + O(e⁻³⁰): g is affine to ~1e-13 near 0
        head.fc1.weight.mul_(0.1)
        head.fc2.bias[0] -= head(torch.zeros(1, 6, dtype=torch.float64))[0, 0] - head(
            torch.zeros(1, 6, dtype=torch.float64)
        )[0, 1]  # boundary through the origin
    gen = torch.Generator().manual_seed(7)
    y = torch.randn(20, 6, generator=gen, dtype=torch.float64) * 0.5
    res = CRCCertifier().certify(head, y)
    w1, w2 = head.fc1.weight.detach(), head.fc2.weight.detach()
    a = (w2[0] - w2[1]) @ w1
    logits = head(y).detach()
    truth = (logits[:, 0] - logits[:, 1]).abs() / a.norm()
    assert bool((res.radius <= truth).all())
    assert torch.allclose(res.radius, truth, rtol=1e-7)
    assert res.stats["dual_tight"] >= 20
    assert res.stats["exact_radius_inputs"] == 20  # and the certifier knows they are exact


# ------------------------------------------------------------------------------------------
# options, cache, classes
# ------------------------------------------------------------------------------------------


def test_top_k_is_marked_heuristic():
    head = MLP(4, 8, 6, scale=2.0, seed=8)
    y = _random_inputs(10, 4, 8)
    cert = CRCCertifier()
    full = cert.certify(head, y)
    part = cert.certify(head, y, top_k=2)
    assert full.exact_classes and not part.exact_classes
    assert any("HEURISTIC" in n for n in part.notes)
    assert bool((part.radius >= full.radius * (1 - 1e-6)).all())  # fewer classes: not smaller
    assert cert.certify(head, y, top_k=5).exact_classes


def test_hundred_classes_small_head():
    head = MLP(8, 16, 100, scale=2.0, seed=9)
    y = _random_inputs(16, 8, 9)
    _, cache, res = _certified(head, y)
    assert res.exact_classes and res.radius.shape == (16,)
    assert bool((res.radius > 0).all())
    assert res.stats["pairs"] == 16 * 99
    assert res.stats["dual_solves"] < 16 * 99  # pairs that cannot decide were skipped
    # lazily computed exact bounds are in the (JSON-serialisable) cache
    assert len(cache["pair_bounds"]) == res.stats["exact_pair_bounds_total"]
    assert len(cache["class_pos"]) + len(cache["class_neg"]) == res.stats["class_bounds_total"] > 0
    assert json.loads(json.dumps(cache)) == cache
    # never below the closed form with the global bounds (lazy bounds are tighter, dual >= it)
    ref = CRCCertifier(curvature="global", dual=False).certify(head, y).radius
    assert bool((res.radius >= ref * (1 - 1e-9)).all())
    # and sound: a cheap SLSQP attack never goes below it
    rng = np.random.default_rng(0)
    for i in range(3):
        upper = _attack_upper_bound(head, y[i].numpy(), int(res.predictions[i]), 1, rng)
        assert res.radius[i].item() <= upper


def test_cache_reuse_and_mismatch():
    head = MLP(4, 8, 3, scale=3.0, seed=10)
    y = _random_inputs(10, 4, 10)
    _, cache, first = _certified(head, y)
    assert cache["fingerprint"] == head_fingerprint(head)
    stored = json.loads(json.dumps(cache))
    again = CRCCertifier(trust_cache=True)
    again.prepare(head, stored)
    second = again.certify(head, y)
    assert first.stats["curvature_bounds_computed"] > 0
    assert second.stats["curvature_bounds_computed"] == 0
    assert torch.allclose(first.radius, second.radius, rtol=1e-6)  # same bounds, other path
    assert any("trust_cache" in n for n in second.notes)
    # by default a given cache is not trusted: the bounds are recomputed
    untrusted = CRCCertifier()
    untrusted.prepare(head, json.loads(json.dumps(cache)))
    third_run = untrusted.certify(head, y)
    assert third_run.stats["curvature_bounds_computed"] > 0
    assert torch.allclose(first.radius, third_run.radius, rtol=1e-6)
    with torch.no_grad():
        head.fc2.weight[0, 0] += 0.5
    third = CRCCertifier()
    fresh = third.prepare(head, stored)
    assert fresh["fingerprint"] != stored["fingerprint"]
    assert len(fresh["pair_bounds"]) == len(fresh["class_pos"]) == 0


def test_forged_cache_cannot_enlarge_radii():
    """A cache with the head's (public) fingerprint but curvature bounds of 0 -- what anyone
    can write into a model file -- must not change the certificate unless trusted."""
    head = MLP(4, 8, 3, scale=3.0, seed=14)
    y = _random_inputs(12, 4, 14)
    honest = CRCCertifier()
    cache = honest.prepare(head)
    want = honest.certify(head, y).radius
    forged = json.loads(json.dumps(cache))
    forged["w1_sq_bound"] = 0.0
    forged["class_pos"] = {str(k): 0.0 for k in range(3)}
    forged["class_neg"] = {str(k): 0.0 for k in range(3)}
    forged["pair_bounds"] = {f"{a},{b}": 0.0 for a in range(3) for b in range(3) if a != b}
    default = CRCCertifier()
    default.prepare(head, forged)
    assert torch.allclose(default.certify(head, y).radius, want, rtol=1e-9)
    trusting = CRCCertifier(trust_cache=True)
    trusting.prepare(head, json.loads(json.dumps(forged)))
    # the opt-in really reuses the stored values (here forged: radii grow)
    assert bool((trusting.certify(head, y).radius > want * (1 + 1e-6)).any())


def test_float32_head_and_solver_dtypes_agree():
    head = MLP(5, 12, 3, scale=2.0, seed=11).float()
    y = _random_inputs(10, 5, 11).float()
    a, b = (CRCCertifier(solver_dtype=d).certify(head, y).radius for d in ("float32", "float64"))
    assert torch.allclose(a, b, rtol=1e-6)


def test_unconverged_dual_falls_back_to_closed_form():
    head = MLP(4, 10, 3, scale=3.0, seed=12)
    y = _random_inputs(10, 4, 12)
    cheap = CRCCertifier(max_iter=1, curvature="exact")
    cache = cheap.prepare(head)
    fast = CRCCertifier(dual=False, curvature="exact")
    fast.prepare(head, cache)
    assert torch.equal(cheap.certify(head, y).radius, fast.certify(head, y).radius)


def test_chunked_results_concatenate_like_one_call():
    head = MLP(4, 8, 5, scale=2.0, seed=13)
    y = _random_inputs(20, 4, 13)
    whole = CRCCertifier(chunk_size=7)
    cache = whole.prepare(head)
    one = whole.certify(head, y)
    parts = [whole.certify(head, y[s : s + 6]) for s in range(0, 20, 6)]
    joined = CertifyResult.concatenate(parts)
    assert torch.equal(joined.predictions, one.predictions)
    assert torch.allclose(joined.radius, one.radius, rtol=1e-6)
    assert joined.stats["inputs"] == 20 and joined.stats["pairs"] == 20 * 4
    assert joined.stats["exact_pair_bounds_total"] == len(cache["pair_bounds"])
    assert len(joined.notes) == len(parts[0].notes)  # notes do not pile up per chunk
