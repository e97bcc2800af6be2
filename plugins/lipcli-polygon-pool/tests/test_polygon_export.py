"""``lip export`` of the polygon pool: the stand-in (:class:`ExportedPolygonPool`, vertices
baked) equals the pool in float64 for several vertex counts and input shapes, and survives
``torch.export`` as aten operations only."""

from __future__ import annotations

import pytest
import torch

from lipcli_polygon_pool import PolygonPool
from lipcli_polygon_pool.polygon import ExportedPolygonPool

import lipcli.testing as checks


def random_pool(vertices: int, channels: int = 8, seed: int = 0) -> PolygonPool:
    """Float64, radii and centres perturbed (irregular polygons off the origin)."""
    pool = PolygonPool(channels, vertices=vertices).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        pool.rho.add_(0.5 * torch.randn(pool.rho.shape, generator=gen, dtype=torch.float64))
        pool.center.copy_(0.3 * torch.randn(pool.center.shape, generator=gen, dtype=torch.float64))
    return pool


@pytest.mark.parametrize("vertices", [3, 6, 16])
@pytest.mark.parametrize("shape", [(16, 8, 3, 3), (100, 8), (5, 8, 7)])
def test_stand_in_equals_the_pool(vertices, shape):
    pool = random_pool(vertices, seed=vertices)
    z = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    checks.check_export_module(pool, ExportedPolygonPool, z)
    with torch.no_grad():
        ref = pool(z)
    assert (ref < 0).any() and (ref > 0).any()  # points inside and outside


def test_stand_in_follows_the_current_polygons():
    pool = random_pool(6)
    checks.check_export_follows(pool, lambda: pool.rho.add_(0.5), torch.randn(32, 8, dtype=torch.float64))


def test_stand_in_survives_torch_export():
    pool = random_pool(6, seed=3)
    program = checks.check_aten_program(pool.export_module(), torch.randn(2, 8, 4, 4, dtype=torch.float64))
    z = torch.randn(7, 8, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(program(z), pool(z), rtol=1e-12, atol=1e-12)
