"""MaxMin, channel max pooling, projection pooling and the LLN / MLP heads (SPEC §2, §4)."""

from __future__ import annotations

import math

import pytest
import torch

from lipcli.builtins.activations import MaxMin
from lipcli.builtins.activations.plugin import lip_activations
from lipcli.builtins.crc import plugin as crc_plugin
from lipcli.builtins.crc.head import MLPHead
from lipcli.builtins.lln import plugin as lln_plugin
from lipcli.builtins.lln.head import LLNHead
from lipcli.builtins.pooling import (
    ChannelMaxPool,
    ProjectionPool,
    cone_signed_distance,
)
from lipcli.builtins.pooling.plugin import lip_pools
from lipcli.sdk.specs import ONE_LIPSCHITZ, ActivationSpec, Component, HeadSpec, PoolSpec

DT = torch.float64


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _pair_inputs(n: int, channels: int, seed: int = 0) -> torch.Tensor:
    """Random (n, channels, 3, 3) inputs with varied scales, ties and exact zeros mixed in."""
    g = _gen(seed)
    z = torch.randn(n, channels, 3, 3, dtype=DT, generator=g)
    z = z * torch.exp(2 * torch.randn(n, 1, 1, 1, dtype=DT, generator=g))
    half = channels // 2
    z[0] = 0.0  # origin for every pair
    z[1, half:] = z[1, :half]  # ties a == b
    z[2, :half] = 0.0  # x == 0
    z[3, half:] = 0.0  # y == 0
    return z


# ---------------------------------------------------------------------------------------------
# reference implementations (independent of the modules under test)


def _spec_three_cases(x: torch.Tensor, y: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """SPEC §2 verbatim: three cases on phi = atan2(y, x) mod 2 pi."""
    phi = torch.remainder(torch.atan2(y, x), 2 * math.pi)
    s, c = torch.sin(theta / 2), torch.cos(theta / 2)
    first = -x * s + y * c
    middle = torch.sqrt(x * x + y * y)
    last = -x * s - y * c
    lo, hi = (math.pi + theta) / 2, (3 * math.pi - theta) / 2
    return torch.where(phi < lo, first, torch.where(phi < hi, middle, last))


def _brute_signed_distance(x: torch.Tensor, y: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Signed distance by projecting onto the two boundary rays r (cos ±theta/2, sin ±theta/2).

    For a closed convex cone with opening <= pi the boundary is the two rays; the distance
    of any point to the boundary is the smaller of its distances to the rays (projection
    clipped at r >= 0), and the sign is + outside and - inside (|angle| <= theta/2).
    """
    dists = []
    for sign in (1.0, -1.0):
        ux, uy = torch.cos(theta / 2), sign * torch.sin(theta / 2)
        t = (x * ux + y * uy).clamp_min(0.0)
        dists.append(torch.hypot(x - t * ux, y - t * uy))
    dist = torch.minimum(*dists)
    inside = torch.atan2(y, x).abs() <= theta / 2
    return torch.where(inside, -dist, dist)


# ---------------------------------------------------------------------------------------------
# specs


def test_activation_and_pool_specs() -> None:
    (maxmin,) = lip_activations()
    assert isinstance(maxmin, ActivationSpec) and maxmin.name == "maxmin"
    assert maxmin.promises == (ONE_LIPSCHITZ,)
    assert isinstance(Component(maxmin).build(8), MaxMin)
    pools = {p.name: p for p in lip_pools()}
    assert set(pools) == {"max", "projection"}
    for spec in pools.values():
        assert isinstance(spec, PoolSpec) and spec.promises == (ONE_LIPSCHITZ,)
    assert isinstance(Component(pools["max"]).build(8), ChannelMaxPool)
    proj = Component(pools["projection"]).build(8)
    assert isinstance(proj, ProjectionPool) and proj.theta.shape == (4,)
    assert proj.no_weight_decay == ("theta",)
    assert [n for n, _ in proj.named_parameters()] == ["theta"]


def test_head_specs() -> None:
    heads = {h.name: h for h in [*lln_plugin.lip_heads(), *crc_plugin.lip_heads()]}
    assert set(heads) == {"lln", "mlp"}
    lln, mlp = heads["lln"], heads["mlp"]
    assert isinstance(lln, HeadSpec) and lln.certificate == "lln" and lln.features == "pool"
    assert mlp.certificate == "crc-lip" and mlp.features == "activation"
    assert mlp.param("hidden").default == 4096 and mlp.param("hidden").type is int
    head = Component(mlp, {"hidden": 16}).build(12, 5)
    assert isinstance(head, MLPHead) and head.fc1.weight.shape == (16, 12)
    assert isinstance(Component(lln).build(12, 5), LLNHead)


# ---------------------------------------------------------------------------------------------
# MaxMin and max pooling


def test_maxmin_formula_and_shape() -> None:
    z = _pair_inputs(6, 8)
    out = MaxMin(8)(z)
    a, b = z[:, :4], z[:, 4:]
    expected = torch.stack([torch.where(a > b, a, b), torch.where(a > b, b, a)], 1).flatten(1, 2)
    assert out.shape == z.shape
    assert torch.equal(out, expected)
    # multiset of each pair preserved, so the l2 norm is preserved exactly
    assert torch.allclose(out.norm(), z.norm(), rtol=0, atol=1e-12)
    with pytest.raises(ValueError):
        MaxMin()(torch.zeros(1, 3, 2, 2))


def test_channel_max_pool_formula() -> None:
    z = _pair_inputs(6, 8)
    out = ChannelMaxPool(8)(z)
    assert out.shape == (6, 4, 3, 3)
    a, b = z[:, :4], z[:, 4:]
    assert torch.equal(out, torch.where(a >= b, a, b))


@pytest.mark.parametrize("layer", [MaxMin(16), ChannelMaxPool(16), "projection"])
def test_one_lipschitz_on_random_pairs(layer) -> None:
    if layer == "projection":
        layer = ProjectionPool(16).to(DT)
        with torch.no_grad():  # include the extreme angles 0 and pi
            layer.theta[0], layer.theta[1] = 0.0, math.pi
    g = _gen(1)
    with torch.no_grad():
        for scale in (1e-3, 1.0, 10.0):
            u = torch.randn(256, 16, 2, 2, dtype=DT, generator=g) * scale
            # far pairs, near pairs (across branch boundaries) and pairs through the origin
            for v in (
                torch.randn(256, 16, 2, 2, dtype=DT, generator=g) * scale,
                u + 1e-3 * scale * torch.randn(256, 16, 2, 2, dtype=DT, generator=g),
                -u,
                torch.zeros_like(u),
            ):
                fu, fv = layer(u), layer(v)
                lhs = (fu - fv).flatten(1).norm(dim=1)
                rhs = (u - v).flatten(1).norm(dim=1)
                assert bool((lhs <= rhs + 1e-12).all()), float((lhs - rhs).max())
                # also per channel pair: each output depends on one input pair only
                half = 8
                du = u - v
                pair_in = (du[:, :half] ** 2 + du[:, half:] ** 2).sqrt()
                if fu.shape[1] == 16:
                    dfu = fu - fv
                    pair_out = (dfu[:, :half] ** 2 + dfu[:, half:] ** 2).sqrt()
                else:
                    pair_out = (fu - fv).abs()
                assert bool((pair_out <= pair_in + 1e-12).all())


def _pair_gradient_norms(layer: torch.nn.Module, z: torch.Tensor) -> list[torch.Tensor]:
    """Norm over each input pair (z_k, z_{k+C/2}) of d out_j / d pair, for each output j."""
    z = z.clone().requires_grad_(True)
    out = layer(z)
    half = z.shape[1] // 2
    outs = [out] if out.shape[1] == half else [out[:, :half], out[:, half:]]
    norms = []
    for o in outs:
        (grad,) = torch.autograd.grad(o.sum(), z, retain_graph=True)
        assert torch.isfinite(grad).all()
        norms.append((grad[:, :half] ** 2 + grad[:, half:] ** 2).sqrt())
    return norms


@pytest.mark.parametrize("layer", [MaxMin(8), ChannelMaxPool(8)])
def test_max_layers_gradient_norms(layer) -> None:
    z = _pair_inputs(8, 8)
    for norm in _pair_gradient_norms(layer, z):
        assert bool((norm <= 1 + 1e-12).all())
    # away from ties the gradient of every output is a unit vector
    z = torch.randn(4, 8, 3, 3, dtype=DT, generator=_gen(3))
    for norm in _pair_gradient_norms(layer, z):
        assert torch.allclose(norm, torch.ones_like(norm))


@pytest.mark.parametrize("layer", [MaxMin(8), ChannelMaxPool(8)])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_max_layers_route_gradients_exactly(layer, fmt) -> None:
    """The hand-written backward equals autograd of the plain ``where`` formulation bit for
    bit (ties go to the first half), keeps the memory format, and double backward works."""
    z = _pair_inputs(5, 8).contiguous(memory_format=fmt).requires_grad_(True)
    out = layer(z)
    g = torch.randn(out.shape, dtype=DT, generator=_gen(4)).contiguous(memory_format=fmt)
    (got,) = torch.autograd.grad(out, z, g)
    zr = z.detach().clone().requires_grad_(True)
    a, b = zr[:, :4], zr[:, 4:]
    ref = torch.where(a >= b, a, b)
    if isinstance(layer, MaxMin):
        ref = torch.cat((ref, torch.where(a >= b, b, a)), 1)
    (want,) = torch.autograd.grad(ref, zr, g)
    assert torch.equal(got, want)
    assert got.is_contiguous(memory_format=fmt)
    assert out.is_contiguous(memory_format=fmt)
    zz = torch.randn(3, 8, 2, 2, dtype=DT, generator=_gen(6)).requires_grad_(True)  # no ties
    assert torch.autograd.gradgradcheck(layer, (zz,))


# ---------------------------------------------------------------------------------------------
# projection pooling


def _theta_grid(n: int) -> torch.Tensor:
    return torch.cat([torch.tensor([0.0, math.pi, math.pi / 2], dtype=DT),
                      torch.rand(n - 3, dtype=DT, generator=_gen(5)) * math.pi])


def test_projection_matches_spec_formula_and_brute_force() -> None:
    theta = _theta_grid(16)
    pool = ProjectionPool(32).to(DT)
    with torch.no_grad():
        pool.theta.copy_(theta)
    z = _pair_inputs(40, 32, seed=7)
    out = pool(z)
    assert out.shape == (40, 16, 3, 3)
    x, y, th = z[:, :16], z[:, 16:], theta.view(1, -1, 1, 1)
    assert torch.allclose(out, _spec_three_cases(x, y, th), rtol=1e-12, atol=1e-12)
    assert torch.allclose(out, _brute_signed_distance(x, y, th), rtol=1e-10, atol=1e-12)


def test_projection_on_special_points() -> None:
    """Apex, axes and the boundary rays themselves, for several angles incl. 0 and pi."""
    for th in (0.0, 0.3, math.pi / 2, 2.0, math.pi):
        theta = torch.tensor(th, dtype=DT)
        r = torch.tensor([0.0, 0.5, 2.0], dtype=DT)
        for ang in (th / 2, -th / 2, 0.0, math.pi, math.pi / 2, -math.pi / 2,
                    (math.pi + th) / 2, -(math.pi + th) / 2):
            x, y = r * math.cos(ang), r * math.sin(ang)
            got = cone_signed_distance(x, y, theta)
            ref = _brute_signed_distance(x, y, theta)
            assert torch.allclose(got, ref, atol=1e-12), (th, ang, got, ref)
        # the boundary rays are at distance 0
        for sign in (1, -1):
            x, y = r * math.cos(th / 2), sign * r * math.sin(th / 2)
            assert torch.allclose(cone_signed_distance(x, y, theta), torch.zeros(3, dtype=DT),
                                  atol=1e-12)


def test_projection_half_plane_float32() -> None:
    """theta = fl32(pi) > pi: cos(theta/2) < 0 in float32 must not flip the sign inside."""
    pool = ProjectionPool(2)
    with torch.no_grad():
        pool.theta.fill_(math.pi)
    z = torch.tensor([[[[3.0]], [[0.0]]], [[[-3.0]], [[0.0]]], [[[2.0]], [[5.0]]]])
    out = pool(z).flatten()
    assert torch.allclose(out, torch.tensor([-3.0, 3.0, -2.0]), atol=1e-6)


def test_projection_clamps_theta() -> None:
    pool = ProjectionPool(4).to(DT)
    with torch.no_grad():
        pool.theta.copy_(torch.tensor([-1.0, 5.0], dtype=DT))
    z = torch.randn(3, 4, 2, 2, dtype=DT, generator=_gen(9))
    clamped = torch.tensor([0.0, math.pi], dtype=DT).view(1, 2, 1, 1)
    assert torch.allclose(pool(z), _brute_signed_distance(z[:, :2], z[:, 2:], clamped),
                          atol=1e-12)


def test_projection_init() -> None:
    torch.manual_seed(0)
    theta = ProjectionPool(4096).theta.detach()
    assert float(theta.min()) >= 0.0 and float(theta.max()) <= math.pi
    assert abs(float(theta.mean()) - math.pi / 2) < 0.1


def test_projection_gradients_finite_and_bounded() -> None:
    theta = _theta_grid(8)
    pool = ProjectionPool(16).to(DT)
    with torch.no_grad():
        pool.theta.copy_(theta)
    z = _pair_inputs(10, 16, seed=11)
    # points exactly on the branch boundaries: boundary rays and the rays at
    # +-(pi + theta)/2 where the apex region starts
    r = torch.rand(8, dtype=DT, generator=_gen(12)) + 0.1
    for k, ang in enumerate((theta / 2, -theta / 2, (math.pi + theta) / 2, -(math.pi + theta) / 2)):
        z[4 + k, :8, 0, 0] = r * torch.cos(ang)
        z[4 + k, 8:, 0, 0] = r * torch.sin(ang)
    (norm,) = _pair_gradient_norms(pool, z)
    assert bool((norm <= 1 + 1e-12).all())
    # at the origin the gradient is finite (checked above) and so is the theta gradient
    zz = z.clone().requires_grad_(True)
    pool(zz).sum().backward()
    assert torch.isfinite(pool.theta.grad).all() and torch.isfinite(zz.grad).all()


def test_projection_gradcheck_generic_points() -> None:
    theta = (torch.rand(3, dtype=DT, generator=_gen(13)) * 2.8 + 0.1).requires_grad_(True)
    z = torch.randn(2, 6, 2, 2, dtype=DT, generator=_gen(14), requires_grad=True)

    def f(z: torch.Tensor, th: torch.Tensor) -> torch.Tensor:
        return cone_signed_distance(z[:, :3], z[:, 3:], th.view(1, -1, 1, 1))

    assert torch.autograd.gradcheck(f, (z, theta))


# ---------------------------------------------------------------------------------------------
# heads


def test_lln_head_formula() -> None:
    torch.manual_seed(0)
    head = LLNHead(12, 5).to(DT)
    y = torch.randn(7, 12, dtype=DT)
    w, b = head.weight.detach(), head.bias.detach()
    w_hat = w / torch.sqrt((w * w).sum(dim=1, keepdim=True))
    expected = y @ w_hat.T + b
    assert torch.allclose(head(y), expected, rtol=1e-13, atol=1e-13)
    assert torch.allclose(head.normalized_weight(), w_hat, atol=1e-15)
    assert torch.allclose(head.normalized_weight().norm(dim=1), torch.ones(5, dtype=DT))
    # scale invariance of every row
    with torch.no_grad():
        head.weight.mul_(torch.tensor([1.0, 2.0, 0.5, 10.0, 3.0], dtype=DT).view(-1, 1))
    assert torch.allclose(head(y), expected, rtol=1e-12, atol=1e-12)
    assert head.no_weight_decay == ("bias",)
    assert sorted(n for n, _ in head.named_parameters()) == ["bias", "weight"]


def test_mlp_head_shapes_and_formula() -> None:
    torch.manual_seed(0)
    head = MLPHead(20, 10, hidden=32).to(DT)
    y = torch.randn(4, 20, dtype=DT)
    out = head(y)
    assert out.shape == (4, 10)
    w1, b1 = head.fc1.weight, head.fc1.bias
    w2, b2 = head.fc2.weight, head.fc2.bias
    expected = torch.log1p(torch.exp(y @ w1.T + b1)) @ w2.T + b2
    assert torch.allclose(out, expected, rtol=1e-12, atol=1e-12)
    assert set(head.no_weight_decay) == {n for n, _ in head.named_parameters()}
    full = MLPHead(2048, 10)
    assert sum(p.numel() for p in full.parameters()) == 2048 * 4096 + 4096 + 4096 * 10 + 10
