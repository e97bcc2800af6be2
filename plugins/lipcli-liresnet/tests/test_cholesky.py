"""``lipcli_liresnet.cholesky``: the Cholesky-orthogonalised matrix ``L⁻¹X`` is a contraction for
square, wide and tall ``X``; each layer's guaranteed bound covers the float64 norm of the matrix
it applies (and exceeds 1 by at most its certificate's tolerance); the quasi-residual form is
``X = I + (W ⊙ γ)·s`` started as the authors' ``LiResMLP``; the export stand-ins compute the
layers; the evaluation matrix follows in-place parameter changes."""

from __future__ import annotations

import pytest
import torch

from lipcli_liresnet.cholesky import AUTHORS_CHOLESKY_RIDGE, CholeskyLinear, CholeskyPatchConv, cholesky_orthogonal


@pytest.mark.parametrize("shape", [(8, 8), (4, 12), (12, 4)])
def test_cholesky_layers_are_contractions_and_bounded(shape):
    torch.manual_seed(0)
    X = torch.randn(*shape, dtype=torch.float64) * 5
    W = cholesky_orthogonal(X)
    assert float(torch.linalg.matrix_norm(W, ord=2)) <= 1.0
    # WWᵀ = I − ε(LᵀL)⁻¹ (module docstring): singular values² 1 − ε/(λ_i(XXᵀ) + ε), ε = 1e-3·mean(diag XXᵀ)
    S = X @ X.T
    eps = AUTHORS_CHOLESKY_RIDGE * float(S.diagonal().mean())
    want = 1.0 - eps / (torch.linalg.eigvalsh(S) + eps)
    torch.testing.assert_close(torch.linalg.eigvalsh(W @ W.T), want, rtol=0, atol=1e-10)
    layer = CholeskyLinear(shape[1], shape[0]).double()
    with torch.no_grad():
        layer.weight.copy_(X)
    norm = float(torch.linalg.matrix_norm(layer.matrix().detach(), ord=2))
    assert norm <= layer.lipschitz_upper_bound() < 1 + 1e-4


def test_patch_conv_norm_is_its_matrix_norm():
    torch.manual_seed(1)
    layer = CholeskyPatchConv(3, 2).double().eval()
    x = torch.zeros(1, 3, 4, 4, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(lambda t: layer(t), x).reshape(-1, x.numel())
    norm = float(torch.linalg.matrix_norm(jac, ord=2))
    assert abs(norm - float(torch.linalg.matrix_norm(layer.matrix(), ord=2))) < 1e-12
    assert norm <= layer.lipschitz_upper_bound()


def test_quasi_residual_form():
    torch.manual_seed(2)
    layer = CholeskyLinear(6, 6, quasi_residual_scale=0.5)
    assert torch.equal(layer.gamma, torch.ones(6, 1)) and "identity" not in layer.state_dict()
    assert float(layer.weight.detach().std()) < 0.5  # the authors' start N(0, 1)/n
    with torch.no_grad():
        layer.gamma.mul_(torch.linspace(-3, 3, 6).view(-1, 1))
    torch.testing.assert_close(layer.source(), torch.eye(6) + layer.weight * layer.gamma * 0.5)
    layer.eval()
    before = layer.lipschitz_upper_bound()
    with torch.no_grad():
        layer.weight.mul_(10.0)
    assert layer.lipschitz_upper_bound() != before  # recomputed after the in-place change
    assert torch.allclose(layer.matrix(), cholesky_orthogonal(layer.source().detach()))
    with pytest.raises(ValueError, match="square"):
        CholeskyLinear(4, 6, quasi_residual_scale=0.5)


def test_export_modules_compute_the_layers():
    torch.manual_seed(0)
    for layer, x in ((CholeskyPatchConv(4, 2), torch.randn(2, 4, 8, 8)),
                     (CholeskyLinear(6, 4), torch.randn(3, 6)),
                     (CholeskyLinear(6, 6, quasi_residual_scale=0.5), torch.randn(3, 6))):
        layer.eval()
        with torch.no_grad():
            assert torch.allclose(layer.export_module()(x), layer(x), rtol=1e-5, atol=1e-6), type(layer).__name__
