"""LOT convolution: the Newton–Schulz polar factor (converges to ``V(VᴴV)^{-1/2}``, norm ``≤ 1``
at every iteration count), dense Jacobians below the declared verified bound at random,
perturbed and briefly trained parameters and for float32 parameters cast exactly to float64
(and all singular values 1 once converged), the bound's parts (Gershgorin, certified Gram
``λ_max``) against exact norms, gradients vs finite differences, parameters, conformance, a
wrong layer.

Tolerances: "≤ bound" is checked with a relative ``1e-12`` (the bound is verified for the
float64 matrices; the dense Jacobian adds only the FFTs' ``O(u log HW)``).  "All singular
values 1" uses ``eps = 0``, 40 iterations and well-conditioned filters (``V̂(f)`` with
condition number ``< 10``, quadratic convergence reached), where the measured defect is
``< 1e-13``; the tolerance ``1e-9`` catches any unconverged or scaled variant.
"""

from __future__ import annotations


import pytest
import torch

import lipcli_lot.plugin as plugin
from lipcli.sdk.specs import ConvSpec
from lipcli.testing import affine_matrix, check_conv_spec, randomise_parameters, singular_values
from lipcli_lot import LOTConv, lot_polar
from lipcli_lot.lot import certified_gram_norm_upper_bound, gershgorin_norm_upper_bounds, polar_norm_upper_bound

CASES = [(4, 4, 3, 1, 6), (3, 4, 3, 1, 6), (8, 4, 3, 1, 6), (4, 16, 3, 2, 6), (4, 8, 3, 2, 2),
         (4, 16, 1, 2, 2), (8, 8, 1, 1, 1), (4, 4, 3, 1, 5)]


def assert_bounded(layer: LOTConv, cin: int, size: int) -> float:
    s = singular_values(layer, (cin, size, size))
    bound = layer.lipschitz_upper_bound()
    assert float(s.max()) <= bound * (1 + 1e-12) and bound <= 1 + 1e-10, (float(s.max()), bound)
    return bound


def well_conditioned(layer: LOTConv, seed: int) -> LOTConv:
    """Centre tap: a random orthogonal-ish block; other taps small (``V̂(f)`` near a fixed
    full-rank matrix at every frequency)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = 0.05 * torch.randn(layer.weight.shape, generator=gen, dtype=layer.weight.dtype)
        k = layer.kernel_size
        o, i = layer.weight.shape[:2]
        q = torch.linalg.qr(torch.randn(max(o, i), max(o, i), generator=gen, dtype=w.dtype)).Q
        w[:, :, k // 2, k // 2] += q[:o, :i]
        layer.weight.copy_(w)
    return layer


@pytest.mark.parametrize("m, n", [(5, 5), (7, 3), (3, 7)])
def test_newton_schulz_converges_to_the_polar_factor(m, n):
    gen = torch.Generator().manual_seed(m + n)
    V = torch.randn(4, m, n, generator=gen, dtype=torch.complex128) + 3 * torch.eye(m, n)
    U, _, Vh = torch.linalg.svd(V, full_matrices=False)
    torch.testing.assert_close(lot_polar(V, 40, 0.0), U @ Vh, rtol=0, atol=1e-12)
    torch.testing.assert_close(lot_polar(V.conj(), 40, 0.0), (U @ Vh).conj(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("iterations", [1, 2, 5, 10])
def test_every_iterate_has_norm_at_most_one(iterations):
    """The exact-arithmetic argument (module docstring) on ill-conditioned matrices."""
    gen = torch.Generator().manual_seed(iterations)
    V = torch.randn(64, 6, 4, generator=gen, dtype=torch.complex128)
    V[:8, :, 0] *= 1e-4  # some nearly rank-deficient ones
    for eps in (0.0, 1e-4):
        norms = torch.linalg.matrix_norm(lot_polar(V, iterations, eps), ord=2)
        assert float(norms.max()) <= 1 + 1e-12


def test_bound_parts_cover_exact_norms_and_are_tight():
    gen = torch.Generator().manual_seed(0)
    V = torch.randn(32, 6, 4, generator=gen, dtype=torch.complex128)
    for W in (lot_polar(V, 2, 1e-4), lot_polar(V, 10, 1e-4).to(torch.complex64), 0.7 * V):
        exact = torch.linalg.matrix_norm(W.to(torch.complex128), ord=2)
        gersh = gershgorin_norm_upper_bounds(W)
        assert bool((gersh >= exact).all())
        for i in range(4):
            refined = certified_gram_norm_upper_bound(W[i])
            assert refined is not None and exact[i] <= refined <= exact[i] * (1 + 1e-7)
        whole = polar_norm_upper_bound(W)
        assert float(exact.max()) <= whole <= float(exact.max()) * (1 + 2e-5)  # REFINE_ABOVE


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES)
@pytest.mark.parametrize("iterations", [2, 10])
def test_random_parameters_are_below_the_bound(cin, cout, k, stride, size, iterations):
    layer = randomise_parameters(LOTConv(cin, cout, k, stride, iterations=iterations).double().eval(), seed=cin + cout)
    assert_bounded(layer, cin, size)


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES)
def test_converged_layers_are_orthogonal(cin, cout, k, stride, size):
    layer = well_conditioned(LOTConv(cin, cout, k, stride, iterations=40, eps=0.0).double().eval(), seed=cin)
    s = singular_values(layer, (cin, size, size))
    assert float((s - 1).abs().max()) <= 1e-9
    assert float(s.max()) <= layer.lipschitz_upper_bound() < 1 + 1e-10


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES[:4])
def test_perturbed_and_trained_parameters_are_below_the_bound(cin, cout, k, stride, size):
    torch.manual_seed(3)
    layer = LOTConv(cin, cout, k, stride).double()
    with torch.no_grad():
        layer.weight.add_(0.3 * torch.randn_like(layer.weight))
    assert_bounded(layer.eval(), cin, size)
    before = layer.weight.detach().clone()
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    target = torch.nn.Conv2d(cin, cout, 3, stride, 1).double()
    layer.train()
    for _ in range(5):
        opt.zero_grad()
        x = torch.randn(4, cin, size, size, dtype=torch.float64)
        ((layer(x) - 3 * target(x).detach()) ** 2).mean().backward()
        opt.step()
    assert not torch.allclose(layer.weight, before)
    assert_bounded(layer.eval(), cin, size)


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES[:5])
def test_float32_parameters_cast_to_float64_are_below_the_bound(cin, cout, k, stride, size):
    layer32 = randomise_parameters(LOTConv(cin, cout, k, stride), seed=7)
    layer = LOTConv(cin, cout, k, stride).double().eval()
    layer.load_state_dict({k_: v.double() for k_, v in layer32.state_dict().items()})  # exact
    assert_bounded(layer, cin, size)


@pytest.mark.parametrize("iterations", [2, 10])
def test_float32_bound_covers_the_float32_matrices(iterations):
    layer = randomise_parameters(LOTConv(8, 8, 3, iterations=iterations), seed=0).eval()
    with torch.no_grad():
        layer(torch.randn(2, 8, 6, 6))
    bound = layer.lipschitz_upper_bound()
    op = layer.eval_operator((6, 6)).to(torch.complex128)  # the float32 matrices, exactly
    dense = affine_matrix(lambda z: layer.apply_operator(z, op), (8, 6, 6))
    norm = float(torch.linalg.matrix_norm(dense, ord=2))
    assert norm <= bound <= norm * (1 + 2e-5)  # tight to REFINE_ABOVE[float32]


@pytest.mark.parametrize("stride, size", [(1, 4), (2, 4), (1, 1)])
def test_gradients_match_finite_differences(stride, size):
    layer = randomise_parameters(LOTConv(2, 4, 3, stride, iterations=3).double(), seed=5).train()
    x = torch.randn(1, 2, size, size, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w, z: torch.func.functional_call(
        layer, {"weight": w, "bias": layer.bias}, (z,)), (layer.weight.detach().requires_grad_(), x),
        fast_mode=True)  # a random projection of the Jacobians (the full check takes minutes)


def test_parameters():
    layer = LOTConv(8, 8, iterations=3, eps=0.0)
    assert layer.iterations == 3 and layer.eps == 0.0
    for bad in ({"iterations": 0}, {"eps": -1.0}, {"init": "zeros"}):
        with pytest.raises(ValueError):
            LOTConv(8, 8, **bad)
    ident = LOTConv(4, 4, eps=0.0).double().eval()  # identity initialisation: W = I
    x = torch.randn(1, 4, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(ident.linear(x), x, rtol=0, atol=1e-12)


@pytest.mark.parametrize("params", [{}, {"init": "random"}, {"iterations": 2, "init": "random"}])
def test_conformance_checks_pass(params):
    reports = check_conv_spec(plugin.lot_spec(), params=params)
    assert len(reports) == 7 and all(r.sigma_max <= r.bound for r in reports)


class _Scaled(LOTConv):
    """Deliberately wrong: a stray scale, claiming bound 1."""

    def compute_operator(self, size):
        return super().compute_operator(size) * 1.01

    def operator_bound(self, op, size):
        return 1.0


def test_a_wrong_layer_is_caught():
    wrong = ConvSpec(name="lot-wrong", factory=_Scaled, description="not bounded",
                     params=plugin.lot_spec().params, promises=())
    with pytest.raises(AssertionError, match="declared bound"):
        check_conv_spec(wrong, params={"eps": 0.0, "iterations": 30})


@pytest.mark.parametrize("cin, cout, size", [(4, 4, 5), (3, 6, 4), (6, 3, 4), (4, 4, 1)])
def test_converged_layer_equals_an_independent_dense_polar_factor(cin, cout, size):
    """The polar factor ``UVᵀ`` (SVD) of the dense spatial-domain matrix of the circular
    convolution equals the converged layer's dense Jacobian (``eps = 0``, 40 iterations) to
    1e-10 in float64: an implementation without FFTs or Newton–Schulz."""
    import torch.nn.functional as F

    layer = well_conditioned(LOTConv(cin, cout, 3, iterations=40, eps=0.0).double().eval(), seed=size)
    K = layer.weight.detach()
    conv = (lambda z: F.conv2d(F.pad(z, (1, 1, 1, 1), mode="circular"), K)) if size > 1 else (
        lambda z: F.conv2d(z, K.sum((2, 3), keepdim=True)))
    U, _, Vh = torch.linalg.svd(affine_matrix(conv, (cin, size, size)), full_matrices=False)
    torch.testing.assert_close(affine_matrix(layer, (cin, size, size)), U @ Vh, rtol=0, atol=1e-10)
