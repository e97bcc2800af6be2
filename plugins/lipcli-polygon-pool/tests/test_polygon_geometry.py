"""The polygon pool computes the exact signed distance to a simple polygon."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lipcli_polygon_pool.polygon import (
    MIN_RADIUS,
    PolygonPool,
    inverse_softplus,
    polygon_angles,
    star_polygon_signed_distance,
)
from polygon_reference import dense_boundary, segments_intersect, signed_distance


def random_pool(channels: int, vertices: int, seed: int, *, spread: float = 1.5) -> PolygonPool:
    """A float64 pool with strongly non-convex polygons (radii log-uniform) and random centres."""
    gen = torch.Generator().manual_seed(seed)
    pool = PolygonPool(channels, vertices=vertices).double()
    with torch.no_grad():
        log_r = (torch.rand(channels // 2, vertices, generator=gen, dtype=torch.float64) * 2 - 1) * spread
        pool.rho.copy_(inverse_softplus(torch.exp(log_r)))
        pool.center.copy_(0.5 * torch.randn(channels // 2, 2, generator=gen, dtype=torch.float64))
    return pool


def pool_points(pool: PolygonPool, points: torch.Tensor) -> torch.Tensor:
    """Evaluate every channel's polygon at the same points ``(M, 2)`` -> ``(M, K)``."""
    k = pool.channels // 2
    z = torch.cat((points[:, :1].expand(-1, k), points[:, 1:].expand(-1, k)), dim=1)
    return pool(z)


@pytest.mark.parametrize("vertices", [3, 4, 6, 9, 16])
def test_matches_bruteforce_reference(vertices):
    pool = random_pool(8, vertices, seed=vertices)
    gen = torch.Generator().manual_seed(1)
    points = torch.randn(3000, 2, generator=gen, dtype=torch.float64) * 2.5
    with torch.no_grad():
        got = pool_points(pool, points).numpy()
    polys = pool.polygons().numpy()
    for k, poly in enumerate(polys):
        want = signed_distance(points.numpy(), poly)
        np.testing.assert_allclose(got[:, k], want, rtol=0, atol=1e-12)
        # both signs occur, so the sign test is exercised
        assert (want < 0).sum() > 20 and (want > 0).sum() > 20


def test_exact_values_on_a_diamond():
    pool = PolygonPool(2, vertices=4).double()
    with torch.no_grad():
        pool.rho.fill_(float(inverse_softplus(torch.tensor(1.0 - MIN_RADIUS, dtype=torch.float64))))
    pts = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.5, 0.5], [1.0, 0.0], [0.0, -3.0],
                        [0.25, 0.25], [-1.0, 1.0]], dtype=torch.float64)
    want = [-1 / math.sqrt(2), 1.0, 0.0, 0.0, 2.0, -0.5 / math.sqrt(2), 1 / math.sqrt(2)]
    with torch.no_grad():
        got = pool_points(pool, pts)[:, 0]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


def test_unsigned_distance_agrees_with_dense_boundary_sampling():
    pool = random_pool(4, 7, seed=3)
    gen = torch.Generator().manual_seed(2)
    points = torch.randn(400, 2, generator=gen, dtype=torch.float64) * 2
    with torch.no_grad():
        got = pool_points(pool, points).abs().numpy()
    for k, poly in enumerate(pool.polygons().numpy()):
        samples = dense_boundary(poly, 4000)
        dense = np.min(np.hypot(points.numpy()[:, None, 0] - samples[None, :, 0],
                                points.numpy()[:, None, 1] - samples[None, :, 1]), axis=1)
        spacing = max(np.hypot(*(np.roll(poly, -1, 0) - poly).T)) / 4000
        assert np.all(dense >= got[:, k] - 1e-12)
        assert np.all(dense <= got[:, k] + spacing)


@pytest.mark.parametrize("vertices", [3, 5, 16])
def test_polygon_is_always_simple_and_counter_clockwise(vertices):
    """Extreme radii (MIN_RADIUS .. 50) never make the star-shaped polygon self-intersect."""
    gen = torch.Generator().manual_seed(vertices)
    for trial in range(20):
        pool = PolygonPool(2, vertices=vertices).double()
        with torch.no_grad():
            pool.rho.copy_(torch.randn(1, vertices, generator=gen, dtype=torch.float64) * 8)
            pool.center.copy_(torch.randn(1, 2, generator=gen, dtype=torch.float64) * 3)
        poly = pool.polygons()[0].numpy()
        assert np.all(pool.radii().detach().numpy() >= MIN_RADIUS)
        n = len(poly)
        for i in range(n):
            for j in range(i + 1, n):
                if j == i + 1 or (i == 0 and j == n - 1):
                    continue  # adjacent edges share a vertex
                assert not segments_intersect(poly[i], poly[(i + 1) % n], poly[j], poly[(j + 1) % n])
        x, y = poly[:, 0], poly[:, 1]
        assert 0.5 * np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y) > 0  # CCW: positive area


def test_points_on_sector_rays_vertices_edges_and_centre():
    """Degenerate positions for the sector inside-test: rays through vertices, the centre."""
    pool = random_pool(2, 6, seed=11)
    radii = pool.radii().detach()[0]
    center = pool.center.detach()[0]
    angles = polygon_angles(6, dtype=torch.float64)
    u = torch.stack((torch.cos(angles), torch.sin(angles)), dim=1)
    factors = torch.tensor([0.0, 0.3, 0.999, 1.0, 1.001, 2.0], dtype=torch.float64)
    pts = (center + factors[:, None, None] * radii[None, :, None] * u[None]).reshape(-1, 2)
    edge_mid = 0.5 * (pool.polygons()[0] + pool.polygons()[0].roll(-1, 0))
    pts = torch.cat((pts, edge_mid, center[None]))
    with torch.no_grad():
        got = pool_points(pool, pts)[:, 0].numpy()
    want = signed_distance(pts.numpy(), pool.polygons()[0].numpy())
    on_boundary = np.abs(want) < 1e-12
    np.testing.assert_allclose(got[~on_boundary], want[~on_boundary], rtol=0, atol=1e-12)
    np.testing.assert_allclose(got[on_boundary], 0.0, atol=1e-12)
    assert got[-1] < 0  # the centre is inside


def test_float32_matches_float64():
    pool64 = random_pool(16, 6, seed=5)
    pool32 = PolygonPool(16, vertices=6)
    pool32.load_state_dict({k: v.float() for k, v in pool64.state_dict().items()})
    z = torch.randn(4, 16, 5, 5, generator=torch.Generator().manual_seed(0)) * 2
    with torch.no_grad():
        out32 = pool32(z)
        out64 = pool64(z.double())
    torch.testing.assert_close(out32.double(), out64, rtol=0, atol=2e-6)


def test_shapes_and_channel_pairing():
    pool = random_pool(6, 5, seed=0)
    z = torch.randn(2, 6, 4, 3, dtype=torch.float64)
    out = pool(z)
    assert out.shape == (2, 3, 4, 3)
    # channel k pairs (z[:, k], z[:, k + 3]) with polygon k
    for k in range(3):
        pts = torch.stack((z[:, k].flatten(), z[:, k + 3].flatten()), dim=1).detach().numpy()
        want = signed_distance(pts, pool.polygons()[k].numpy())
        np.testing.assert_allclose(out[:, k].detach().flatten().numpy(), want, atol=1e-12)
    # any number of spatial dims, including none
    assert pool(z[:, :, 0, 0]).shape == (2, 3)


def test_initialisation_is_a_near_regular_polygon():
    torch.manual_seed(0)
    pool = PolygonPool(64, vertices=8, radius=1.5)
    radii = pool.radii().detach()
    assert radii.shape == (32, 8)
    assert torch.all((radii > 1.5 * 0.8) & (radii < 1.5 * 1.25))
    assert abs(float(radii.mean()) - 1.5) < 0.05
    assert torch.equal(pool.center.detach(), torch.zeros(32, 2))


def test_invalid_arguments():
    for bad in (2, 17):
        with pytest.raises(ValueError, match="vertices"):
            PolygonPool(8, vertices=bad)
    with pytest.raises(ValueError, match="even"):
        PolygonPool(7)
    with pytest.raises(ValueError, match="radius"):
        PolygonPool(8, radius=0.0)
    with pytest.raises(ValueError, match="channels"):
        PolygonPool(8)(torch.randn(1, 6, 2, 2))
    with pytest.raises(ValueError, match="same shape"):
        star_polygon_signed_distance(torch.zeros(1, 1), torch.zeros(1, 2),
                                     torch.ones(1, 3), polygon_angles(3), torch.zeros(1, 2))
