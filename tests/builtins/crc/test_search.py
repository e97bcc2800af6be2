"""The pruned CRC-Lip search (lipcli.builtins.crc.search, .pruning): the cheap gradient-norm
bounds dominate the exact ones, the pruned search gives the exhaustive search's radii while
computing far fewer exact norms, early-stopped dual solves stay sound, and per-pair values
agree with an independent SLSQP solve."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from crc_helpers import MLP
from lipcli.builtins.crc.certifier import CRCCertifier
from lipcli.builtins.crc.closed_form import pair_margins, point_margins
from lipcli.builtins.crc.dual import solve_dual
from lipcli.builtins.crc.pruning import exact_gradient_norm, gradient_norm_upper
from lipcli.builtins.crc.search import ChunkSearch, all_pair_gradients


def _inputs(n: int, dim: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=gen, dtype=torch.float64) * scale


def _prepared(head, **params) -> CRCCertifier:
    cert = CRCCertifier(**params)
    cert.prepare(head)
    return cert


def _true_gradient_norms(head, y: torch.Tensor) -> torch.Tensor:
    """‖∇(h_l - h_j)(y)‖ for all j by float64 autograd (l = argmax) of the certified function
    (softplus = log(1 + eˣ) exactly, without F.softplus's threshold shortcut)."""
    w1, b1, w2, b2 = (p.detach().double() for p in (head.fc1.weight, head.fc1.bias, head.fc2.weight, head.fc2.bias))

    def h(v):
        return torch.logaddexp(torch.zeros(()).double(), v @ w1.T + b1) @ w2.T + b2

    out = []
    for i in range(y.shape[0]):
        jac = torch.autograd.functional.jacobian(h, y[i : i + 1]).reshape(-1, y.shape[1])
        lab = int(h(y[i : i + 1]).argmax())
        out.append((jac[lab] - jac).norm(dim=1))
    return torch.stack(out)


@pytest.mark.parametrize("dim,hidden,classes,scale,yscale,seed", [
    (6, 16, 10, 1.0, 1.5, 0), (8, 20, 100, 2.0, 1.5, 1), (5, 12, 7, 6.0, 8.0, 2), (4, 9, 3, 0.3, 0.1, 3),
])
def test_cheap_norm_bound_dominates_exact_and_computed(dim, hidden, classes, scale, yscale, seed):
    head = MLP(dim, hidden, classes, scale=scale, seed=seed)
    y = _inputs(12, dim, seed, yscale)
    cert = _prepared(head)
    w, sq = cert.weights, cert.bounds.w1_sq_bound
    full = pair_margins(w, y, sq, lambda s1, pred: all_pair_gradients(w, s1, pred))
    t = point_margins(w, y)
    upper = gradient_norm_upper(w, sq, t)
    true = _true_gradient_norms(head, y)
    assert bool((upper >= true).all())
    assert bool((upper >= full.gn_hi).all())  # so r_lo <= the exhaustive search's r_fast
    assert float((upper / full.gn_hi).median()) < 3  # and not vacuous
    # the exact norms of chosen pairs are the exhaustive ones
    bi = torch.arange(12).repeat_interleave(2)
    ji = torch.tensor([0, classes - 1] * 12)
    exact = exact_gradient_norm(w, sq, t, bi, ji)
    assert torch.allclose(exact, full.gn_hi[bi, ji], rtol=1e-13, atol=0)
    assert bool((exact >= true[bi, ji]).all())


def _compare(head, y, **params):
    new = _prepared(head, **params).certify(head, y)
    ref_cert = _prepared(head, **params)
    ref_cert._prune = False  # the exhaustive search: every exact norm, no early stop
    ref = ref_cert.certify(head, y)
    assert torch.equal(new.predictions, ref.predictions)
    old, nw = ref.radius, new.radius
    assert bool((nw <= old * (1 + 1e-12)).all()), (nw / old).max()
    assert bool(((nw - old).abs() <= 1e-5 * old).all()), ((nw - old).abs() / old).max()
    assert ref.stats["exact_gradient_norms"] == 0  # the reference really was exhaustive
    return new, ref


@pytest.mark.parametrize("classes,seed", [(10, 0), (10, 1), (100, 2), (100, 3)])
@pytest.mark.parametrize("params", [{}, {"curvature": "exact"}, {"dual": False}, {"curvature": "global"}])
def test_pruned_radii_equal_exhaustive(classes, seed, params):
    if classes == 100 and params.get("curvature") == "exact":
        pytest.skip("9,900 exact bounds: covered at 10 classes")
    head = MLP(8, 24, classes, scale=2.0, seed=seed)
    y = _inputs(24, 8, seed)
    new, ref = _compare(head, y, **params)
    assert bool((new.radius > 0).any())
    pairs = new.stats["pairs"]
    if classes == 100:  # pruning did prune
        assert new.stats["exact_gradient_norms"] < pairs / 3
    if params.get("dual", True):
        assert new.stats["dual_solves"] == ref.stats["dual_solves"]  # the same picks


def test_pruned_radii_equal_exhaustive_top_k_and_chunks():
    head = MLP(6, 16, 30, scale=3.0, seed=5)
    y = _inputs(20, 6, 5)
    _compare(head, y, chunk_size=7)
    new = _prepared(head).certify(head, y, top_k=5)
    ref_cert = _prepared(head)
    ref_cert._prune = False
    ref = ref_cert.certify(head, y, top_k=5)
    assert torch.allclose(new.radius, ref.radius, rtol=1e-12, atol=0)


def test_early_stopped_dual_is_sound_and_above_stop():
    head = MLP(5, 12, 4, scale=3.0, seed=6)
    y = _inputs(8, 5, 6)
    cert = _prepared(head, curvature="exact")
    w = cert.weights
    t = point_margins(w, y)
    j = (t.pred + 1) % 4
    a = w.w2[t.pred] - w.w2[j]
    m, _ = cert.bounds.lower_curvature(t.pred)
    args = (w, t.z0, t.z0_err, a, w.b2[t.pred] - w.b2[j], t.g[torch.arange(8), j], (a * t.s1) @ w.w1,
            m[torch.arange(8), j], cert.settings)
    full = solve_dual(*args)
    assert not bool(full.stopped.any())
    stop = 0.5 * full.radius
    part = solve_dual(*args, stop=stop)
    assert bool(part.stopped[full.radius > 0].all())
    assert bool((part.radius[part.stopped] > stop[part.stopped]).all())
    assert bool((part.radius <= full.radius * (1 + 1e-9)).all())
    assert int(part.iterations.sum()) <= int(full.iterations.sum())


def _slsqp_distance(head, y: np.ndarray, label: int, j: int, rng) -> float:
    """Distance to a point with g_lj <= 0 found by SLSQP (an upper bound on the distance)."""
    w1, b1 = head.fc1.weight.detach().numpy(), head.fc1.bias.detach().numpy()
    w2, b2 = head.fc2.weight.detach().numpy(), head.fc2.bias.detach().numpy()
    d, c0 = w2[label] - w2[j], b2[label] - b2[j]
    g = lambda x: d @ np.logaddexp(0.0, w1 @ x + b1) + c0  # noqa: E731
    best = math.inf
    for _ in range(6):
        x0 = y + rng.standard_normal(y.shape) * rng.uniform(0.1, 3.0)
        res = minimize(lambda x: 0.5 * np.sum((x - y) ** 2), x0, jac=lambda x: x - y,
                       constraints=[{"type": "ineq", "fun": lambda x: -g(x)}], method="SLSQP",
                       options={"maxiter": 300, "ftol": 1e-14})
        for k in range(60):  # push along the ray until certainly across (g <= 0)
            s = 1 + 1e-12 * 2**k
            if g(y + s * (res.x - y)) <= 0:
                best = min(best, s * float(np.linalg.norm(res.x - y)))
                break
    return best


def test_per_pair_values_match_independent_slsqp():
    head = MLP(4, 10, 10, scale=2.5, seed=7)
    y = _inputs(6, 4, 7)
    cert = _prepared(head, curvature="exact")
    stats = {k: 0 for k in ("inputs", "pairs", "exact_gradient_norms", "dual_solves", "dual_tight",
                            "dual_boundary", "dual_improved", "dual_stopped_early", "hvps",
                            "newton_iters", "rounds")}
    ch = ChunkSearch(cert, y, None, stats, prune=True)
    ch.dual_rounds()
    rng = np.random.default_rng(7)
    checked = tight_checked = 0
    for b, j in ch.solved.nonzero().tolist():
        upper = _slsqp_distance(head, y[b].numpy(), int(ch.t.pred[b]), j, rng)
        value = float(ch.cert[b, j])
        assert value <= upper * (1 + 1e-12)
        checked += 1
        if bool(ch.tight[b, j]):  # interior dual optimum: the certificate is the distance
            assert value >= upper * (1 - 1e-5), (b, j, value, upper)
            tight_checked += 1
    assert checked >= 6 and tight_checked >= 3
