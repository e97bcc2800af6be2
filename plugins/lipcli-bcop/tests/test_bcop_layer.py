"""BCOP: Björck, the block construction, orthogonality of dense Jacobians at convergence, the
verified bound (also before convergence), conformance and a wrong layer."""

from __future__ import annotations

import pytest
import torch

import lipcli_bcop.plugin as plugin
from lipcli.sdk.specs import ConvSpec
from lipcli.testing import affine_matrix, check_conv_spec
from lipcli_bcop import BCOPConv, bcop_kernel, bjorck
import lipcli_bcop.bcop as bcop_module
from lipcli_bcop.bcop import bjorck_converged



def perturbed(layer: BCOPConv, seed: int, scale: float = 0.5) -> BCOPConv:
    """A float64 layer whose parameters are far from orthogonal (Björck has work to do)."""
    gen = torch.Generator().manual_seed(seed)
    layer = layer.double().eval()
    with torch.no_grad():
        for p in (layer.ortho, layer.proj_x, layer.proj_y):
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return layer


def test_bjorck_converges_to_the_polar_factor():
    gen = torch.Generator().manual_seed(0)
    M = torch.randn(3, 6, 4, generator=gen, dtype=torch.float64)
    A = bjorck_converged(M)
    torch.testing.assert_close(A.mT @ A, torch.eye(4, dtype=A.dtype).expand(3, 4, 4), rtol=0, atol=1e-12)
    U, _, Vh = torch.linalg.svd(M, full_matrices=False)
    torch.testing.assert_close(A, U @ Vh, rtol=0, atol=1e-10)


def test_unconverged_bjorck_never_expands():
    """s -> s(3 - s^2)/2 maps [0, 1] into [0, 1]: every iterate has norm <= 1."""
    gen = torch.Generator().manual_seed(1)
    M = torch.randn(8, 8, generator=gen, dtype=torch.float64)
    for iters in (1, 2, 5):
        assert float(torch.linalg.matrix_norm(bjorck(M, iters), ord=2)) <= 1 + 1e-12


def test_kernel_is_the_product_of_the_blocks():
    """Two blocks (3x3 filter): the symbol H (P + (I-P) zx)(Q + (I-Q) zy)... at random z."""
    gen = torch.Generator().manual_seed(2)
    c = 4
    H = torch.linalg.qr(torch.randn(c, c, generator=gen, dtype=torch.float64))[0]
    Vx = bjorck_converged(torch.randn(2, c, 2, generator=gen, dtype=torch.float64))
    Vy = bjorck_converged(torch.randn(2, c, 2, generator=gen, dtype=torch.float64))
    K = bcop_kernel(H, Vx, Vy)
    assert K.shape == (c, c, 3, 3)
    zy, zx = torch.exp(1j * torch.rand(2, generator=gen, dtype=torch.float64) * 6.283)
    symbol = sum(K[:, :, a, b].to(torch.complex128) * zy**a * zx**b for a in range(3) for b in range(3))
    eye = torch.eye(c, dtype=torch.float64)
    want = H.to(torch.complex128)
    for t in range(2):
        P, Q = Vx[t] @ Vx[t].T, Vy[t] @ Vy[t].T
        want = want @ (P + (eye - P) * zx) @ (Q + (eye - Q) * zy)
    torch.testing.assert_close(symbol, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(symbol.mH @ symbol, eye.to(torch.complex128), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "cin, cout, k, stride, size",
    [(4, 4, 3, 1, 6), (4, 8, 3, 1, 6), (8, 4, 3, 1, 6), (4, 16, 3, 2, 6), (4, 4, 3, 2, 6),
     (4, 16, 1, 2, 2), (8, 8, 1, 1, 1), (4, 8, 3, 2, 2)],
)
def test_dense_jacobian_singular_values_are_all_one_at_convergence(cin, cout, k, stride, size):
    """4 channels, 6x6 input, float64, parameters far from orthogonal: eval mode runs Björck
    to convergence, the operator is (semi-)orthogonal within 1e-6, below the bound."""
    layer = perturbed(BCOPConv(cin, cout, k, stride), seed=cin + cout + k + stride)
    svals = torch.linalg.svdvals(affine_matrix(layer, (cin, size, size)))
    torch.testing.assert_close(svals, torch.ones_like(svals), rtol=0, atol=1e-6)
    assert float(svals.max()) <= layer.lipschitz_upper_bound() < 1 + 1e-10


def test_training_filter_before_convergence_is_bounded(monkeypatch):
    """One Björck step (far from orthogonal): sigma_max <= 1 (exact arithmetic) and <= the
    verified bound of that filter."""
    from lipcli.numerics.gram_bounds import conv_gram_norm_upper_bound

    layer = perturbed(BCOPConv(4, 4, 3, 1, bjorck_iters=1), seed=5).train()
    monkeypatch.setattr(bcop_module, "TRAIN_MAX_ITERS", 1)  # stop after one step
    with torch.no_grad():
        op = layer.compute_operator(None)
    dense = affine_matrix(lambda z: layer.apply_operator(z, op), (4, 6, 6))
    norm = float(torch.linalg.matrix_norm(dense, ord=2))
    assert norm <= 1 + 1e-12 and norm <= conv_gram_norm_upper_bound(op)
    assert float(torch.linalg.svdvals(dense).min()) < 0.9  # really not converged


def test_float32_bound_is_close_to_one():
    torch.manual_seed(0)
    layer = BCOPConv(16, 16).eval()
    bound = layer.lipschitz_upper_bound()
    assert 1.0 <= bound < 1 + 1e-5
    op = layer.eval_operator().double()
    dense = affine_matrix(lambda z: layer.apply_operator(z, op), (16, 5, 5))
    assert float(torch.linalg.matrix_norm(dense, ord=2)) <= bound


def test_conformance_checks_pass():
    reports = check_conv_spec(plugin.bcop_spec(), params={"bjorck_iters": 10})
    assert len(reports) == 7 and all(abs(r.sigma_min - 1) < 1e-9 for r in reports)


class _NoProjector(BCOPConv):
    """Deliberately wrong: the blocks use the raw matrices V Vᵀ without Björck, while the
    layer still claims bound 1."""

    def compute_operator(self, size):
        K = bcop_kernel(self.ortho, self.proj_x * 2.0, self.proj_y)
        return K[: self.out_channels, : self.conv_in_channels].contiguous()

    compute_eval_operator = compute_operator

    def operator_bound(self, op, size):
        return 1.0


def test_a_wrong_layer_is_caught():
    wrong = ConvSpec(name="bcop-wrong", factory=_NoProjector, description="no projectors")
    with pytest.raises(AssertionError, match="declared bound"):
        check_conv_spec(wrong)


def test_the_bound_is_for_the_eval_filter_in_either_mode():
    layer = perturbed(BCOPConv(4, 4), seed=9)
    eval_bound = layer.lipschitz_upper_bound()
    layer.train()
    assert layer.lipschitz_upper_bound() == eval_bound
    assert torch.equal(layer.eval_operator(), layer.eval().eval_operator())


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_training_filter_converges_to_the_eval_filter(dtype, tol):
    """Issue 26 item 12: from M/||M||_F, 20 steps left a Gaussian 64x64 matrix 0.16 from
    orthogonal (Frobenius), so training used another filter than the one eval certifies.
    Now training converges: defect at rounding level, and the eval filter within 1e-5/1e-12."""
    layer = BCOPConv(64, 64, 3).to(dtype).train()
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in (layer.ortho, layer.proj_x, layer.proj_y):
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    with torch.no_grad():
        train_op = layer.compute_operator(None)
        H = train_op.sum(dim=(2, 3))  # the symbol at z = 1: the product of H and I's
    eye = torch.eye(64, dtype=dtype)
    assert float(torch.linalg.matrix_norm(H.mT @ H - eye)) <= tol
    eval_op = layer.eval().eval_operator()
    assert float((train_op - eval_op).abs().max()) <= tol


def test_training_start_keeps_singular_values_in_the_convergence_region():
    """The spectral start divides by max(power estimate, ||M||_F/1.7): every singular value
    stays below sqrt(3) even for a power estimate far too low (a rank-one-ish matrix whose top
    singular vector the start misses), so the unconverged iterates never expand."""
    from lipcli_bcop.bcop import _spectral_start

    gen = torch.Generator().manual_seed(7)
    M = torch.randn(32, 32, generator=gen, dtype=torch.float64)
    u, _, vh = torch.linalg.svd(M)
    spiky = u @ torch.diag(torch.tensor([1e6] + [1.0] * 31, dtype=torch.float64)) @ vh
    for A in (M, spiky, torch.zeros(4, 4, dtype=torch.float64)):
        assert float(torch.linalg.matrix_norm(_spectral_start(A), ord=2)) < 3**0.5
    assert abs(float(torch.linalg.matrix_norm(_spectral_start(M), ord=2)) - 1) < 1e-2  # not 0.53


def test_module_docstring_has_no_unfinished_sentence():
    """Issue 26 item 13: "complete for ``k`` up to …" was left unfinished."""
    import lipcli_bcop.bcop as module

    assert "…" not in module.__doc__ and "..." not in module.__doc__
