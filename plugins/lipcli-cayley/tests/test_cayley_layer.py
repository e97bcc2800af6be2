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
from lipcli_cayley.cayley import _phases



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
