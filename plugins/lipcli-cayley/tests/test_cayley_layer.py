"""Cayley convolution: the transform, the Fourier assembly, orthogonality of dense Jacobians,
the verified float32 bound, the recorded image size, conformance and a wrong layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lipcli_cayley.plugin as plugin
from lipcli.sdk.errors import LipError
from lipcli.sdk.specs import ConvSpec
from lipcli.testing import affine_matrix, check_conv_spec
from lipcli_cayley import CayleyConv, cayley
from lipcli.sdk.fourier import phases as _phases



def randomised(layer: CayleyConv, seed: int) -> CayleyConv:
    gen = torch.Generator().manual_seed(seed)
    layer = layer.double().eval()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen, dtype=torch.float64))
        layer.alpha.fill_(2.0)
    return layer


@pytest.mark.parametrize("m, n", [(5, 5), (7, 3), (3, 7), (1, 4)])
def test_cayley_transform_is_semi_orthogonal(m, n):
    gen = torch.Generator().manual_seed(m * 10 + n)
    A = torch.randn(6, m, n, generator=gen, dtype=torch.complex128)
    Q = cayley(A)
    gram = Q.mH @ Q if m >= n else Q @ Q.mH
    torch.testing.assert_close(gram, torch.eye(min(m, n), dtype=Q.dtype).expand_as(gram), rtol=0, atol=1e-12)
    assert torch.allclose(cayley(A.conj()), Q.conj(), atol=1e-12)  # keeps real maps real


def test_square_case_is_the_classical_cayley_transform():
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    S = A - A.T
    eye = torch.eye(4, dtype=torch.float64)
    torch.testing.assert_close(cayley(A), torch.linalg.solve(eye + S, eye - S), rtol=0, atol=1e-12)


@pytest.mark.parametrize("size", [1, 2, 5, 6])
def test_fourier_assembly_is_the_circular_convolution(size):
    """Without the transform the Fourier-domain operator is conv2d with circular padding."""
    gen = torch.Generator().manual_seed(size)
    layer = CayleyConv(3, 4, 3).double().eval()
    W = torch.randn(4, 3, 3, 3, generator=gen, dtype=torch.float64)
    ey = _phases(size, 3, size, torch.complex128, W.device)
    ex = _phases(size, 3, size // 2 + 1, torch.complex128, W.device)
    A = torch.einsum("oiab,ya,xb->yxoi", W.to(torch.complex128), ey, ex).reshape(-1, 4, 3)
    x = torch.randn(2, 3, size, size, generator=gen, dtype=torch.float64)
    want = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="circular"), W) if size > 1 else (
        F.linear(x.reshape(2, 3), W.sum((2, 3))).view(2, 4, 1, 1))
    op = A if size > 1 else A.real
    torch.testing.assert_close(layer.apply_operator(x, op), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "cin, cout, k, stride, size",
    [(4, 4, 3, 1, 6), (4, 8, 3, 1, 6), (8, 4, 3, 1, 6), (4, 16, 3, 2, 6), (4, 4, 3, 2, 6),
     (4, 16, 1, 2, 2), (8, 8, 1, 1, 1), (4, 8, 3, 2, 2)],
)
def test_dense_jacobian_singular_values_are_all_one(cin, cout, k, stride, size):
    """4 channels, 6x6 input, float64, random filters: (semi-)orthogonal within 1e-6."""
    layer = randomised(CayleyConv(cin, cout, k, stride), seed=cin + cout + k + stride)
    svals = torch.linalg.svdvals(affine_matrix(layer, (cin, size, size)))
    torch.testing.assert_close(svals, torch.ones_like(svals), rtol=0, atol=1e-6)
    assert float(svals.max()) <= layer.lipschitz_upper_bound() < 1 + 1e-10


def test_float32_bound_covers_the_float32_matrices():
    torch.manual_seed(0)
    layer = CayleyConv(8, 8, 3).eval()
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        layer(x)
    bound = layer.lipschitz_upper_bound()
    assert 1.0 <= bound < 1.0 + 1e-4
    # the exact map of the float32 matrices, evaluated in float64
    op = layer.eval_operator((6, 6)).to(torch.complex128)
    dense = affine_matrix(lambda z: layer.apply_operator(z, op), (8, 6, 6))
    assert float(torch.linalg.matrix_norm(dense, ord=2)) <= bound


def test_image_size_is_recorded_saved_and_enforced():
    layer = CayleyConv(2, 2)
    with pytest.raises(LipError, match="not seen an input"):
        layer.lipschitz_upper_bound()
    layer(torch.randn(1, 2, 4, 4))
    assert layer.spatial_size.tolist() == [4, 4]
    with pytest.raises(ValueError, match="4x4"):
        layer(torch.randn(1, 2, 8, 8))
    fresh = CayleyConv(2, 2)
    fresh.load_state_dict(layer.state_dict())
    assert fresh.bound_size() == (4, 4)
    strided = CayleyConv(2, 8, 3, 2)
    strided(torch.randn(1, 2, 8, 8))
    assert strided.spatial_size.tolist() == [4, 4]  # after the rearrangement


def test_conformance_checks_pass():
    reports = check_conv_spec(plugin.cayley_spec())
    assert len(reports) == 7 and all(abs(r.sigma_min - 1) < 1e-9 for r in reports)


class _NotSkew(CayleyConv):
    """Deliberately wrong: the Cayley transform of A itself, not of its skew part."""

    def compute_operator(self, size):
        op = super().compute_operator(size)
        return op * 1.05  # e.g. a stray scale: no longer orthogonal

    def operator_bound(self, op, size):
        return 1.0


def test_a_wrong_layer_is_caught():
    wrong = ConvSpec(name="cayley-wrong", factory=_NotSkew, description="not orthogonal",
                     promises=plugin.cayley_spec().promises)
    with pytest.raises(AssertionError, match="declared bound|orthogonal"):
        check_conv_spec(wrong)


# ---------------------------------------------------------------- issue 26 item 4: the solve
def _corrupting_solve(real_solve, *, batched_only: bool, raise_instead: bool = False):
    """torch.linalg.solve as a broken batched LAPACK call behaved: wrong (rows of the result
    swapped, as a misapplied pivot does) or raising, for batched inputs only (or always)."""

    def solve(S, B, *, left=True, **kw):
        X = real_solve(S, B, left=left, **kw)
        if batched_only and S.dim() < 3:
            return X
        if raise_instead:
            raise RuntimeError("Pivots given to lu_solve must all be greater or equal to 1")
        return X.flip(-2) * 3.0
    return solve


def _random_complex(seed: int, shape=(24, 6, 6), dtype=torch.complex64):
    gen = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(shape, generator=gen, dtype=torch.complex128)).to(dtype)


@pytest.mark.parametrize("raise_instead", [False, True])
def test_a_wrong_or_failing_batched_solve_is_detected_and_redone(monkeypatch, raise_instead):
    A = _random_complex(1, (24, 8, 6))
    want = cayley(A)
    monkeypatch.setattr(torch.linalg, "solve", _corrupting_solve(torch.linalg.solve, batched_only=True,
                                                                 raise_instead=raise_instead))
    Q = cayley(A)
    assert Q.dtype == torch.complex64
    torch.testing.assert_close(Q, want, rtol=0, atol=1e-5)
    eye = torch.eye(6, dtype=Q.dtype)
    assert float((Q.mH @ Q - eye).abs().max()) < 1e-5


def test_a_solve_wrong_even_per_matrix_raises_rather_than_certifying(monkeypatch):
    layer = CayleyConv(4, 4, 3).eval()
    monkeypatch.setattr(torch.linalg, "solve", _corrupting_solve(torch.linalg.solve, batched_only=False))
    with pytest.raises(LipError, match="Cayley transform: the linear solve"):
        layer(torch.randn(1, 4, 6, 6))


def test_the_residual_check_accepts_correct_solves_in_both_precisions():
    from lipcli_cayley.cayley import solve_residual_ok

    for dtype in (torch.complex64, torch.complex128, torch.float32):
        S = torch.eye(16, dtype=dtype) + _random_complex(2, (40, 16, 16), torch.complex128) * 3
        B = _random_complex(3, (40, 20, 16), torch.complex128)
        S, B = (S.real, B.real) if not dtype.is_complex else (S, B)
        S, B = S.to(dtype), B.to(dtype)
        X = torch.linalg.solve(S, B, left=False)
        assert solve_residual_ok(S, B, X)
        eps = torch.finfo(X.real.dtype if X.is_complex() else X.dtype).eps
        assert not solve_residual_ok(S, B, X * (1 + 1e6 * eps))  # 0.12 (single), 2e-10 (double)
        assert not solve_residual_ok(S, B, X.flip(-2))


def test_eval_forward_applies_exactly_the_operator_whose_bound_is_recorded(monkeypatch):
    """With gradients to the parameters in eval mode the operator is recomputed (for the
    graph); the values applied must still be the cached operator's, the one the bound is
    for, even when the recomputation rounds differently (here: perturbed by 1e-3)."""
    from lipcli.numerics.gram_bounds import isometry_norm_upper_bound

    torch.manual_seed(0)
    layer = CayleyConv(4, 4, 3).eval()
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        layer(x)
    recorded = layer.lipschitz_upper_bound()
    used: list[torch.Tensor] = []
    real_apply, real_compute = layer.apply_operator, layer.compute_operator
    monkeypatch.setattr(layer, "apply_operator", lambda z, op: (used.append(op.detach()), real_apply(z, op))[1])
    monkeypatch.setattr(layer, "compute_operator", lambda size: real_compute(size) * (1 + 1e-3))
    y = layer(x)
    y.sum().backward()  # gradients still reach the parameters
    assert layer.weight.grad is not None and float(layer.weight.grad.abs().sum()) > 0
    assert torch.equal(used[-1], layer.eval_operator((6, 6)))
    assert isometry_norm_upper_bound(used[-1]) == recorded
    with torch.no_grad():
        torch.testing.assert_close(y, layer(x), rtol=0, atol=0)


def test_changing_the_thread_count_does_not_change_the_operator():
    """The reported trigger: a changed process thread count before the batched solve."""
    before = torch.get_num_threads()
    layer = CayleyConv(16, 16, 3).eval()
    x = torch.randn(1, 16, 8, 8)
    with torch.no_grad():
        layer(x)
    first = layer.eval_operator((8, 8)).clone()
    try:
        torch.set_num_threads(1)
        torch.set_num_threads(max(2, before))
        layer.invalidate()
        with torch.no_grad():
            layer(x)
        torch.testing.assert_close(layer.eval_operator((8, 8)), first, rtol=0, atol=1e-6)
    finally:
        torch.set_num_threads(before)
