"""The maths of the HouseHolder activations: 1-Lipschitz, orthogonal Jacobian a.e., the
order-1 fold formula, the order-2 sectors, continuity, and the special cases."""

from __future__ import annotations

import math

import pytest
import torch

from lipcli.testing import check_gradient_norm_preserving, check_one_lipschitz
from lipcli_householder import HouseHolder, householder_order1, householder_order2


def _module(order: int, channels: int = 8, seed: int = 0) -> HouseHolder:
    torch.manual_seed(seed)
    module = HouseHolder(channels, order=order).double()
    with torch.no_grad():  # spread the angles over their whole range, not only the init
        for p in module.parameters():
            p.uniform_(0.0, 2 * math.pi, generator=torch.Generator().manual_seed(seed + 7))
    return module


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_one_lipschitz(order, seed):
    report = check_one_lipschitz(_module(order, seed=seed), (8, 2, 2), seed=seed, name=f"hh{order}")
    assert report.max_jacobian_norm == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("order", [1, 2])
def test_jacobian_orthogonal_almost_everywhere(order):
    lo, hi = check_gradient_norm_preserving(_module(order), (8, 3, 3), points=8, tol=1e-10)
    assert 1 - 1e-10 <= lo <= hi <= 1 + 1e-10


@pytest.mark.parametrize("order", [1, 2])
def test_gradient_norm_preserved_through_autograd(order):
    module = _module(order, channels=16)
    z = torch.randn(5, 16, 4, 4, dtype=torch.float64, requires_grad=True)
    g = torch.randn(5, 16, 4, 4, dtype=torch.float64)
    (grad,) = torch.autograd.grad(module(z), z, grad_outputs=g)
    torch.testing.assert_close(grad.flatten(1).norm(dim=1), g.flatten(1).norm(dim=1), rtol=1e-12, atol=0)


def _reflection(angle: torch.Tensor) -> torch.Tensor:
    c, s = torch.cos(angle), torch.sin(angle)
    return torch.stack((torch.stack((c, s)), torch.stack((s, -c))))


def test_order1_is_identity_or_the_householder_reflection():
    theta = torch.tensor([0.3, 2.0, 4.5], dtype=torch.float64)
    z = torch.randn(200, 6, dtype=torch.float64)
    out = householder_order1(z, theta)
    for k in range(3):
        v = torch.stack((torch.sin(theta[k] / 2), -torch.cos(theta[k] / 2)))
        reflect = torch.eye(2, dtype=torch.float64) - 2 * torch.outer(v, v)
        torch.testing.assert_close(reflect, _reflection(theta[k]))
        pair = z[:, [k, k + 3]]
        expected = torch.where((pair @ v > 0).unsqueeze(1), pair @ reflect.T, pair)
        torch.testing.assert_close(out[:, [k, k + 3]], expected, rtol=1e-13, atol=1e-13)


def test_order1_at_init_is_maxmin_with_swapped_outputs():
    module = HouseHolder(6, order=1).double()
    z = torch.randn(10, 6, 2, 2, dtype=torch.float64)
    x, y = z[:, :3], z[:, 3:]
    torch.testing.assert_close(module(z), torch.cat((torch.minimum(x, y), torch.maximum(x, y)), 1),
                               rtol=1e-6, atol=1e-6)  # θ = π/2 rounded to float32


def _order2_reference(z: torch.Tensor, t0: float, t1: float, t2: float) -> torch.Tensor:
    """Pair by pair in polar form: the four sector maps of the module docstring."""
    out = torch.empty_like(z)
    a1, a2, a3 = t1 / 2, (t1 + t2) / 2, math.pi + t2 / 2
    rot = torch.tensor([[math.cos(t2), math.sin(t2)], [-math.sin(t2), math.cos(t2)]], dtype=z.dtype)
    for i, (x, y) in enumerate(z.tolist()):
        u = (math.atan2(y, x) - t0 / 2) % (2 * math.pi)
        p = torch.tensor([x, y], dtype=z.dtype)
        if u < a1:
            out[i] = p
        elif u < a2:
            out[i] = _reflection(torch.tensor(t0 + t1, dtype=z.dtype)) @ p
        elif u < a3:
            out[i] = rot @ p
        else:
            out[i] = _reflection(torch.tensor(t0, dtype=z.dtype)) @ p
    return out


@pytest.mark.parametrize("angles", [(0.4, 1.1, 2.3), (3.0, 5.9, 0.2), (-1.0, 0.0, 6.0)])
def test_order2_matches_the_sector_definition(angles):
    t0, t1, t2 = angles
    z = torch.randn(400, 2, dtype=torch.float64) * 3
    out = householder_order2(z, *(torch.tensor([t], dtype=torch.float64) for t in angles))
    torch.testing.assert_close(out, _order2_reference(z, t0, t1, t2), rtol=1e-12, atol=1e-12)


def test_order2_is_continuous_across_every_sector_boundary():
    t0, t1, t2 = 0.7, 2.2, 1.3
    thetas = [torch.tensor([t], dtype=torch.float64) for t in (t0, t1, t2)]
    for rel in (0.0, t1 / 2, (t1 + t2) / 2, math.pi + t2 / 2):
        angle = torch.tensor(rel + t0 / 2, dtype=torch.float64)
        for side in (-1e-9, 1e-9):
            p = torch.stack((torch.cos(angle + side), torch.sin(angle + side))).view(1, 2) * 2.0
            q = torch.stack((torch.cos(angle - side), torch.sin(angle - side))).view(1, 2) * 2.0
            gap = float((householder_order2(p, *thetas) - householder_order2(q, *thetas)).norm())
            assert gap <= 1e-8  # the inputs are 4e-9 apart


def test_order2_with_theta2_zero_is_order1_with_theta0():
    theta0 = torch.tensor([0.9, 4.0], dtype=torch.float64)
    theta1 = torch.tensor([2.5, 0.3], dtype=torch.float64)
    z = torch.randn(300, 4, dtype=torch.float64)
    torch.testing.assert_close(
        householder_order2(z, theta0, theta1, torch.zeros(2, dtype=torch.float64)),
        householder_order1(z, theta0), rtol=1e-12, atol=1e-12,
    )


def test_angles_learn():
    module = HouseHolder(4, order=2)
    z = torch.randn(16, 4, 3, 3)
    module(z).pow(3).sum().backward()
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in module.parameters())


def test_a_discontinuous_variant_is_caught():
    """The checks can fail: order 1 with a rotation instead of the reflection on the folded
    half plane is piecewise orthogonal but jumps across the line."""

    def broken(z: torch.Tensor) -> torch.Tensor:
        x, y = z[:, :4], z[:, 4:]
        theta = torch.full((1, 4, 1, 1), 1.0, dtype=z.dtype)
        sel = x * torch.sin(theta / 2) - y * torch.cos(theta / 2) > 0
        c, s = torch.cos(theta), torch.sin(theta)
        return torch.cat((torch.where(sel, x * c - y * s, x), torch.where(sel, x * s + y * c, y)), 1)

    with pytest.raises(AssertionError, match="not 1-Lipschitz"):
        check_one_lipschitz(broken, (8, 2, 2), name="broken")


def test_scaled_variant_is_not_gradient_norm_preserving():
    module = _module(1)
    with pytest.raises(AssertionError, match="not gradient-norm preserving"):
        check_gradient_norm_preserving(lambda z: 0.999 * module(z), (8, 2, 2))


def test_bad_channel_counts():
    with pytest.raises(ValueError, match="even"):
        HouseHolder(5)
    with pytest.raises(ValueError, match="order"):
        HouseHolder(4, order=3)
    with pytest.raises(ValueError, match="channels"):
        HouseHolder(4)(torch.randn(1, 6, 2, 2))
