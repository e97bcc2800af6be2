"""``lip export`` of the HouseHolder activations: the stand-in (:class:`ExportedHouseHolder`,
per-pair sines, cosines and sector limits baked) equals the activation in float64 for both
orders, 2-D and 4-D inputs and angles outside the clamp range, and survives
``torch.export`` as aten operations only."""

from __future__ import annotations

import math

import pytest
import torch

from lipcli_householder import HouseHolder
from lipcli_householder.householder import ExportedHouseHolder

import lipcli.testing as checks


def random_activation(order: int, channels: int = 8, seed: int = 0) -> HouseHolder:
    """Float64, angles uniform in [-π, 3π) (θ1, θ2 partly outside their clamp to [0, 2π])."""
    act = HouseHolder(channels, order).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in act.parameters():
            p.copy_(4 * math.pi * torch.rand(p.shape, generator=gen, dtype=torch.float64) - math.pi)
    return act


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("shape", [(64, 8, 3, 3), (200, 8), (5, 8, 7)])
def test_stand_in_equals_the_activation(order, shape):
    act = random_activation(order, seed=order)
    z = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    checks.check_export_module(act, ExportedHouseHolder, z)
    with torch.no_grad():
        assert not torch.allclose(act(z), z)  # the test points reach the non-identity sectors


def test_stand_in_follows_the_current_angles():
    """Baked when exported: the stand-in of a changed activation differs (the test above
    can fail)."""
    act = random_activation(2)
    checks.check_export_follows(act, lambda: act.theta0.add_(1.0), torch.randn(32, 8, dtype=torch.float64))


@pytest.mark.parametrize("order", [1, 2])
def test_stand_in_survives_torch_export(order):
    act = random_activation(order, seed=order + 5)
    program = checks.check_aten_program(act.export_module(), torch.randn(2, 8, 4, 4, dtype=torch.float64))
    z = torch.randn(7, 8, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(program(z), act(z), rtol=1e-12, atol=1e-12)
