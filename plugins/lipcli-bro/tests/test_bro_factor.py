"""BRO's training route on CPU (``factor="auto"``): Cholesky QR checked by its orthogonality
defect, Householder QR beyond :func:`defect_limit`, Householder QR for every eval matrix.

Tolerances: in float64 both routes give reflectors unitary to a few ``u·c`` (``u = 1.1e-16``)
on these tiny, well-conditioned layers, so the dense Jacobian's singular values are 1 to
``1e-9`` (measured below ``1e-14``) and the two routes' matrices and gradients agree to
``1e-10`` (same function in exact arithmetic; a wrong basis is off by ``O(1)``).
"""

from __future__ import annotations

import math

import pytest
import torch

from lipcli.numerics.gram_bounds import isometry_norm_upper_bound
from lipcli.testing import affine_matrix, randomise_parameters
from lipcli_bro import BROConv, block_reflector
from lipcli_bro.bro import cholesky_basis, defect_limit, orthogonality_defect
from lipcli.sdk.fourier import kernel_spectrum


class Spy:
    """Counts calls to ``torch.linalg.qr`` and :func:`cholesky_basis` inside ``lipcli_bro.bro``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import lipcli_bro.bro as bro

        self.qr = self.cholesky = 0
        qr, chol = torch.linalg.qr, bro.cholesky_basis

        def count_qr(*args, **kwargs):
            self.qr += 1
            return qr(*args, **kwargs)

        def count_chol(*args, **kwargs):
            self.cholesky += 1
            return chol(*args, **kwargs)

        monkeypatch.setattr(torch.linalg, "qr", count_qr)
        monkeypatch.setattr(bro, "cholesky_basis", count_chol)


def ill_conditioned(c: int, r: int, kappa: float, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A real ``c × r`` matrix with singular values from 1 down to ``1/kappa``, mixed by random
    orthogonal factors on both sides (so its Gram matrix is not diagonal)."""
    gen = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(c, r, generator=gen, dtype=torch.float64)).Q
    R = torch.linalg.qr(torch.randn(r, r, generator=gen, dtype=torch.float64)).Q
    s = torch.logspace(0, -math.log10(kappa), r, dtype=torch.float64)
    return ((U * s) @ R.T).to(dtype)


def training_jacobian(layer: BROConv, shape: tuple[int, int, int]) -> torch.Tensor:
    """The dense matrix of the training-mode layer (gradients enabled, so ``auto`` takes the
    training route)."""
    assert layer.training and torch.is_grad_enabled()
    n = math.prod(shape)
    basis = torch.eye(n, dtype=layer.weight.dtype).view(n, *shape)
    out = layer(torch.cat([basis, torch.zeros(1, *shape, dtype=basis.dtype)]))
    return (out[:n] - out[n:]).reshape(n, -1).T.detach()


def test_defect_limit_is_the_root_of_the_unit_roundoff():
    assert defect_limit(torch.float32) == defect_limit(torch.complex64) == 2.0**-12
    assert defect_limit(torch.float64) == defect_limit(torch.complex128) == 2.0**-26.5


@pytest.mark.parametrize("stride, size, cin, cout", [(1, 4, 3, 3), (2, 4, 2, 4), (1, 5, 4, 2), (1, 3, 2, 6), (1, 1, 4, 4), (2, 1, 2, 8)])
def test_both_routes_have_their_jacobian_within_the_bound(monkeypatch, stride, size, cin, cout):
    """Training on CPU takes the checked Cholesky route, eval Householder QR; the dense
    float64 Jacobian of each is orthogonal and within the verified bound of its matrices, and
    the eval matrices are bit-identical to ``factor="qr"``'s (so certificates are unchanged)."""
    spy = Spy(monkeypatch)
    layer = randomise_parameters(BROConv(cin, cout, 3, stride).double(), seed=7 + size).train()
    layer.cholesky_min_channels = 1  # these tiny layers take the CPU Cholesky route too
    shape = (cin, size * stride, size * stride)
    J = training_jacobian(layer, shape)
    assert (spy.cholesky, spy.qr) == (1, 0)
    train_op = layer.compute_operator((size, size))
    s = torch.linalg.svdvals(J)
    assert float((s - 1).abs().max()) <= 1e-9
    assert float(s.max()) <= isometry_norm_upper_bound(train_op.detach()) < 1 + 1e-10

    layer.eval()
    J_eval = affine_matrix(layer, shape)
    assert spy.qr >= 1 and spy.cholesky == 2  # compute_operator above; eval uses QR only
    s = torch.linalg.svdvals(J_eval)
    assert float(s.max()) <= layer.lipschitz_upper_bound() < 1 + 1e-10
    torch.testing.assert_close(J, J_eval, rtol=0, atol=1e-10)  # the same map up to rounding
    twin = BROConv(cin, cout, 3, stride, factor="qr").double().eval()
    twin.load_state_dict(layer.state_dict())
    assert torch.equal(layer.eval_operator((size, size)), twin.eval_operator((size, size)))
    assert layer.lipschitz_upper_bound() == twin.lipschitz_upper_bound()


def test_float32_training_route_is_bounded_by_its_own_verified_bound():
    """float32 layer on CPU: the Cholesky matrices' exact map (float64 Jacobian of the float32
    matrices) stays within their verified bound, which stays within ``1 + 4√u``."""
    torch.manual_seed(1)
    layer = BROConv(8, 8, 3, init="random").train()
    layer.cholesky_min_channels = 1
    op = layer.compute_operator((4, 4)).detach()
    bound = isometry_norm_upper_bound(op)
    assert bound <= 1 + 4 * defect_limit(torch.float32)
    exact = torch.linalg.matrix_norm(op.to(torch.complex128), ord=2).max()
    assert float(exact) <= bound


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ill_conditioned_filter_falls_back_to_householder_qr(monkeypatch, dtype):
    """A 1×1 image (the real DC bin: ``V̂`` is the filter itself) with ``κ(V̂) = 10⁶``: the
    Cholesky route's defect exceeds the limit, the layer uses Householder QR (bit-identical
    matrices), and its Jacobian is still within the verified bound."""
    layer = BROConv(16, 16, 1, rank=8).to(dtype).train()
    layer.cholesky_min_channels = 1
    with torch.no_grad():
        layer.weight.copy_(ill_conditioned(16, 8, 1e6, dtype, seed=3)[:, :, None, None])
    Qh, info = cholesky_basis(layer.weight[:, :, 0, 0].detach())
    assert not info.any() or orthogonality_defect(Qh) > defect_limit(dtype)
    spy = Spy(monkeypatch)
    op = layer.compute_operator((1, 1))
    assert (spy.cholesky, spy.qr) == (1, 1)
    with torch.no_grad():
        assert torch.equal(op, block_reflector(layer.weight[:, :, 0, 0][None], "qr"))
    J = training_jacobian(layer.double(), (16, 1, 1)) if dtype == torch.float64 else None
    if J is not None:
        assert float(torch.linalg.svdvals(J).max()) <= layer.lipschitz_upper_bound() < 1 + 1e-10
    assert isometry_norm_upper_bound(op.detach()) < 1 + 1e-4


def test_checked_route_keeps_cholesky_when_well_conditioned_and_handles_breakdown():
    gen = torch.Generator().manual_seed(0)
    V = torch.randn(6, 12, 5, generator=gen, dtype=torch.complex64)
    assert torch.equal(block_reflector(V, "checked"), block_reflector(V, "cholesky"))
    singular = V.clone()
    singular[2, :, 4] = singular[2, :, 3]  # rank deficient at one frequency: Cholesky breaks down
    W = block_reflector(singular, "checked")
    assert torch.equal(W, block_reflector(singular, "qr"))
    assert bool(torch.isfinite(W).all())
    Qh, _ = cholesky_basis(V)
    assert orthogonality_defect(Qh) < 1e-5
    assert orthogonality_defect(torch.full((2, 3), float("nan"))) == math.inf


def test_cholesky_gradients_match_householder_and_finite_differences():
    """The routes compute the same function, so their gradients agree (float64); gradcheck of
    the checked route through the layer (weight and input)."""
    layer = randomise_parameters(BROConv(3, 3, 3).double(), seed=11).train()
    layer.cholesky_min_channels = 1
    twin = BROConv(3, 3, 3, factor="qr").double().train()
    twin.load_state_dict(layer.state_dict())
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    target = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    g1, = torch.autograd.grad(((layer(x) - target) ** 2).sum(), layer.weight)
    g2, = torch.autograd.grad(((twin(x) - target) ** 2).sum(), twin.weight)
    assert float(g1.abs().max()) > 1e-3
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-10)
    z = x[:1].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda w, inp: torch.func.functional_call(
        layer, {"weight": w, "bias": layer.bias}, (inp,)), (layer.weight.detach().requires_grad_(), z),
        fast_mode=True)
    V = torch.randn(3, 6, 3, dtype=torch.complex128, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: block_reflector(v, "checked"), (V,), fast_mode=True)


def test_small_layers_keep_householder_qr_and_large_ones_take_cholesky(monkeypatch):
    spy = Spy(monkeypatch)
    small = BROConv(8, 8, 3).train()
    assert small.channels < BROConv.cholesky_min_channels
    small(torch.randn(1, 8, 4, 4)).sum().backward()
    assert (spy.cholesky, spy.qr) == (0, 1)
    large = BROConv(32, BROConv.cholesky_min_channels, 1, 2).train()  # c = 128 at 1×1
    large(torch.randn(1, 32, 2, 2)).sum().backward()
    assert (spy.cholesky, spy.qr) == (1, 1)
    with torch.no_grad():
        large(torch.randn(1, 32, 2, 2))  # no gradients: the eval matrices, Householder QR
    assert (spy.cholesky, spy.qr) == (1, 2)
