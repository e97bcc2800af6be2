"""The ``ortho`` head: orthonormal rows (or columns), a smooth parametrisation, the same
applied matrix in float32 and float64, and a guaranteed Lipschitz bound."""

from __future__ import annotations

import copy

import pytest
import torch

import lipcli_ortho_head.plugin as plugin
from lipcli.testing import check_component_spec, check_head_lipschitz
from lipcli_ortho_head import OrthoHead, orthonormalize


@pytest.mark.parametrize("shape", [(10, 32), (10, 10), (12, 4)])
def test_orthonormal_rows_or_columns(shape):
    torch.manual_seed(0)
    head = OrthoHead(shape[1], shape[0])
    w = head.normalized_weight().detach().double()
    assert head.normalized_weight().dtype == torch.float32
    gram = w @ w.T if shape[0] <= shape[1] else w.T @ w
    torch.testing.assert_close(gram, torch.eye(min(shape), dtype=torch.float64), rtol=0, atol=1e-6)
    sv = torch.linalg.svdvals(w)
    bound = head.lipschitz_upper_bound()
    assert float(sv.max()) <= bound <= 1 + 1e-6


def test_positive_diagonal_qr_is_continuous():
    """LAPACK's raw QR can flip a row's sign under a tiny change; the sign-fixed one cannot."""
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(5, 9, generator=gen, dtype=torch.float64)
    v[:, 0] = torch.tensor([1e-12, -1e-12, 0.0, 1e-12, -1e-12])  # first entries near zero
    w = orthonormalize(v)
    for _ in range(5):
        nudged = orthonormalize(v + 1e-9 * torch.randn(5, 9, generator=gen, dtype=torch.float64))
        assert float((nudged - w).abs().max()) < 1e-7
    # the rows span the same space as v's rows, in order (Gram-Schmidt): w_1 ∝ v_1
    torch.testing.assert_close(w[0], v[0] / v[0].norm())


def test_float64_copy_applies_the_same_matrix():
    torch.manual_seed(2)
    head = OrthoHead(16, 5)
    head64 = copy.deepcopy(head).double()
    assert torch.equal(head.normalized_weight(), head64.normalized_weight())
    y = torch.randn(7, 16)
    torch.testing.assert_close(head(y).double(), head64(y.double()), rtol=1e-5, atol=1e-5)


def test_gradients_reach_the_weight_and_bias():
    head = OrthoHead(8, 3)
    torch.nn.functional.cross_entropy(head(torch.randn(4, 8)), torch.tensor([0, 1, 2, 0])).backward()
    assert float(head.weight.grad.abs().sum()) > 0 and float(head.bias.grad.abs().sum()) > 0


def test_spec_and_declared_bound_conformance():
    spec = plugin.ortho_spec()
    check_component_spec(spec)
    assert spec.certificate == "margin" and spec.features == "pool"
    report = check_head_lipschitz(spec, in_features=16, num_classes=5)
    assert 0.999 < report.max_jacobian_norm <= report.bound <= 1 + 1e-6


def test_head_lipschitz_check_can_fail():
    """A head that declares a bound below its true constant is caught."""
    from lipcli.sdk.specs import HeadSpec

    class Liar(OrthoHead):
        def forward(self, y):
            return 1.5 * super().forward(y)

    spec = HeadSpec(name="liar", factory=lambda d, c: Liar(d, c), description="wrong bound",
                    certificate="margin")
    with pytest.raises(AssertionError, match="exceeds its declared Lipschitz bound"):
        check_head_lipschitz(spec, in_features=8, num_classes=3)
