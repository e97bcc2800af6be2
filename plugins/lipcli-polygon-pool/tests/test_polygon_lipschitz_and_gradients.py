"""1-Lipschitz in the input (pairs and gradient norms) and correct, finite gradients."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from lipcli_polygon_pool.polygon import (
    MIN_RADIUS,
    PolygonPool,
    polygon_angles,
    star_polygon_signed_distance,
)
from polygon_reference import segment_distance, signed_distance
from test_polygon_geometry import random_pool


def test_one_lipschitz_on_random_pairs_per_channel():
    """|d(p) - d(p')| <= |p - p'| for every pair, including pairs straddling the boundary."""
    pool = random_pool(16, 7, seed=21)
    gen = torch.Generator().manual_seed(0)
    for scale, gap in ((2.0, 1e-3), (2.0, 0.3), (2.0, 3.0), (20.0, 5.0)):
        a = torch.randn(500, 16, generator=gen, dtype=torch.float64) * scale
        b = a + torch.randn(500, 16, generator=gen, dtype=torch.float64) * gap
        with torch.no_grad():
            da, db = pool(a), pool(b)
        step = torch.hypot(a[:, :8] - b[:, :8], a[:, 8:] - b[:, 8:])
        assert torch.all((da - db).abs() <= step * (1 + 1e-12) + 1e-15)
        if gap >= 0.3:
            assert torch.any(da.sign() != db.sign())  # some pairs cross the boundary


def test_gradient_norm_is_one_almost_everywhere():
    """The signed distance to a curve has |grad| = 1 off the medial axis: exactly one here."""
    pool = random_pool(16, 9, seed=4)
    z = (torch.randn(64, 16, 3, 3, dtype=torch.float64) * 2).requires_grad_(True)
    pool(z).sum().backward()
    grad_norm = torch.hypot(z.grad[:, :8], z.grad[:, 8:])
    torch.testing.assert_close(grad_norm, torch.ones_like(grad_norm), rtol=0, atol=1e-12)


def test_full_jacobian_spectral_norm_at_most_one():
    pool = random_pool(8, 5, seed=8)
    for seed in range(4):
        z = torch.randn(1, 8, 2, 2, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(seed)) * 2
        jac = torch.autograd.functional.jacobian(pool, z).reshape(16, 32)
        assert float(torch.linalg.matrix_norm(jac, ord=2)) <= 1 + 1e-12


def _smooth_points(poly: np.ndarray, count: int, seed: int, margin: float = 1e-2) -> np.ndarray:
    """Random points away from every kink: the boundary, the medial axis (two nearest
    edges almost tied) and the edge/vertex region switches (projection near t = 0, 1)."""
    rng = np.random.default_rng(seed)
    n = len(poly)
    kept = []
    while len(kept) < count:
        p = rng.normal(size=(1, 2)) * 1.5 + poly.mean(0)
        dists = np.sort([segment_distance(p, poly[i], poly[(i + 1) % n])[0] for i in range(n)])
        if dists[0] < margin or dists[1] - dists[0] < margin:
            continue
        i = int(np.argmin([segment_distance(p, poly[i], poly[(i + 1) % n])[0] for i in range(n)]))
        a, e = poly[i], poly[(i + 1) % n] - poly[i]
        t = float((p[0] - a) @ e / (e @ e))
        if min(abs(t), abs(t - 1)) < margin:
            continue
        kept.append(p[0])
    return np.array(kept)


def test_gradcheck_inputs_radii_and_centre():
    """Analytic gradients w.r.t. points, vertex parameters and centre match finite differences."""
    k, n = 2, 6
    gen = torch.Generator().manual_seed(3)
    rho = (torch.randn(k, n, generator=gen, dtype=torch.float64) * 0.7).requires_grad_(True)
    center = (torch.randn(k, 2, generator=gen, dtype=torch.float64) * 0.3).requires_grad_(True)
    angles = polygon_angles(n, dtype=torch.float64)

    def radii_of(r):
        return F.softplus(r) + MIN_RADIUS

    polys = []
    with torch.no_grad():
        vx = center[:, :1] + radii_of(rho) * torch.cos(angles)
        vy = center[:, 1:] + radii_of(rho) * torch.sin(angles)
        polys = [np.stack((vx[c].numpy(), vy[c].numpy()), 1) for c in range(k)]
    pts = [_smooth_points(polys[c], 12, seed=c) for c in range(k)]
    x = torch.tensor(np.stack([p[:, 0] for p in pts], 1)[:, :, None], dtype=torch.float64)
    y = torch.tensor(np.stack([p[:, 1] for p in pts], 1)[:, :, None], dtype=torch.float64)
    x.requires_grad_(True)
    y.requires_grad_(True)

    def fn(x_, y_, rho_, center_):
        return star_polygon_signed_distance(x_, y_, radii_of(rho_), angles, center_)

    # the points really are on both sides of the boundary
    with torch.no_grad():
        values = fn(x, y, rho, center)
    assert (values < 0).any() and (values > 0).any()
    assert torch.autograd.gradcheck(fn, (x, y, rho, center), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradients_finite_on_boundary_vertices_and_centre():
    pool = random_pool(2, 5, seed=2)
    poly = pool.polygons()[0]
    mids = 0.5 * (poly + poly.roll(-1, 0))
    pts = torch.cat((poly, mids, pool.center.detach()))
    z = torch.cat((pts[:, :1], pts[:, 1:]), dim=1).clone().requires_grad_(True)
    out = pool(z)
    torch.testing.assert_close(out[:10, 0], torch.zeros(10, dtype=torch.float64), rtol=0, atol=1e-12)
    out.sum().backward()
    assert torch.isfinite(z.grad).all()
    assert torch.isfinite(pool.rho.grad).all() and torch.isfinite(pool.center.grad).all()
    # on an edge's interior the gradient is the outward unit normal (smooth across the edge)
    edge = (poly.roll(-1, 0) - poly)
    normal = torch.stack((edge[:, 1], -edge[:, 0]), 1) / edge.norm(dim=1, keepdim=True)
    torch.testing.assert_close(z.grad[5:10], normal, rtol=0, atol=1e-12)
    assert torch.all(z.grad.norm(dim=1) <= 1 + 1e-12)


def test_training_step_moves_polygon_towards_points():
    """A few SGD steps that minimise |d| over points on a circle of radius 2 grow the polygon."""
    torch.manual_seed(0)
    pool = PolygonPool(2, vertices=8).double()
    t = torch.linspace(0, 2 * np.pi, 50, dtype=torch.float64)
    z = torch.stack((2 * torch.cos(t), 2 * torch.sin(t)), 1)
    opt = torch.optim.SGD(pool.parameters(), lr=0.2)
    before = float(pool(z).detach().abs().mean())
    for _ in range(100):
        opt.zero_grad()
        pool(z).abs().mean().backward()
        opt.step()
    after = float(pool(z).detach().abs().mean())
    assert before > 0.9 and after < 0.2
    assert np.allclose(signed_distance(z.numpy(), pool.polygons()[0].numpy()),
                       pool(z).detach()[:, 0].numpy(), atol=1e-12)


def test_vertex_lookup_matches_indexing_and_its_gradient_is_reproducible():
    """``_take_vertices`` gives the values of advanced indexing; the parameter gradients of a
    pool are the same on every run with two threads (advanced indexing's backward, used
    before, accumulated in a varying order there) and agree with a one-hot reference."""
    from lipcli_polygon_pool.polygon import _take_vertices

    gen = torch.Generator().manual_seed(3)
    v = torch.randn(16, 6, generator=gen, dtype=torch.float64)
    for shape in ((5, 16), (4, 16, 3, 3)):
        index = torch.randint(0, 6, shape, generator=gen)
        channel = torch.arange(16).reshape(1, 16, *([1] * (len(shape) - 2)))
        assert torch.equal(_take_vertices(v, index), v[channel, index])
        g = torch.randn(shape, generator=gen, dtype=torch.float64)
        vv = v.clone().requires_grad_(True)
        (_take_vertices(vv, index) * g).sum().backward()
        one_hot = F.one_hot(index, 6).to(torch.float64)  # (..., 6) per point
        want = (one_hot * g.unsqueeze(-1)).transpose(0, 1).reshape(16, -1, 6).sum(1)
        torch.testing.assert_close(vv.grad, want, rtol=1e-12, atol=1e-12)

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pool = random_pool(64, 6, seed=8).float()
        z = torch.randn(128, 64, 8, 8, generator=gen) * 2
        grads = []
        for _ in range(4):
            pool.zero_grad(set_to_none=True)
            pool(z).square().sum().backward()
            grads.append([p.grad.clone() for p in pool.parameters()])
        for other in grads[1:]:
            assert all(torch.equal(a, b) for a, b in zip(grads[0], other))
    finally:
        torch.set_num_threads(threads)
