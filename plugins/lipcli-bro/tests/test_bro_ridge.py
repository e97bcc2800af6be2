"""BRO's ``ridge`` (the BRONet authors' LipConvNet solve with ``VᴴV + ε·I``,
``ε = ridge·mean(diag VᴴV)``): the matrices are the SVD formula ``I − U diag(2σ²/(σ²+ε)) Uᴴ``
(an independent computation), contractions in exact arithmetic; the layer's dense float64
Jacobian is within its guaranteed bound, also for a rank-deficient filter (where the ridge
matters most); ``ridge=0`` is the exact reflector, bit for bit the layer without the parameter."""

from __future__ import annotations

import pytest
import torch

import lipcli_bro.plugin as plugin
from lipcli.sdk.specs import Component
from lipcli.testing import randomise_parameters, singular_values
from lipcli_bro import BROConv
from lipcli_bro.border import ridge_reflector


@pytest.mark.parametrize("ridge", [1e-5, 0.3])
def test_ridge_reflector_is_the_svd_formula_and_a_contraction(ridge):
    gen = torch.Generator().manual_seed(0)
    V = torch.randn(6, 5, 2, dtype=torch.complex128, generator=gen)
    W = ridge_reflector(V, ridge)
    U, S, _ = torch.linalg.svd(V, full_matrices=False)
    eps = ridge * (S ** 2).mean(-1, keepdim=True)  # mean(diag VᴴV) = ‖V‖_F² / r = mean σ²
    gain = 2 * S ** 2 / (S ** 2 + eps)
    want = torch.eye(5, dtype=V.dtype) - (U * gain[:, None, :].to(V.dtype)) @ U.mH
    torch.testing.assert_close(W, want, rtol=0, atol=1e-12)
    assert float(torch.linalg.matrix_norm(W, ord=2).max()) <= 1 + 1e-12
    assert float(torch.linalg.matrix_norm(W, ord=2).min()) >= 1 - 1e-12  # the eigenvalue 1 off range V


@pytest.mark.parametrize("cin, cout, k, stride, size", [(4, 4, 3, 1, 5), (2, 8, 3, 2, 4), (8, 4, 3, 1, 3)])
def test_ridge_layer_jacobian_is_within_the_bound(cin, cout, k, stride, size):
    layer = randomise_parameters(BROConv(cin, cout, k, stride, border="zero", init="random", ridge=1e-5,
                                         rank_rule="lipconvnet", rank_ratio=0.5).double(), seed=cin + cout).eval()
    s = singular_values(layer, (cin, size, size))
    assert float(s.max()) <= layer.lipschitz_upper_bound() <= 1 + 1e-3
    assert "orthogonal" not in Component(plugin.bro_spec(), {"ridge": 1e-5}).build(cin, cout, k, stride).lip_promises


def test_ridge_bound_covers_a_rank_deficient_filter():
    """Two equal columns of ``V``: ``σ_min = 0`` at every frequency, so ``W_ε`` has the
    eigenvalue ``1`` there and is far from orthogonal; the verified bound still covers it."""
    layer = BROConv(4, 4, 3, 1, rank=2, ridge=1e-5, init="random").double()
    with torch.no_grad():
        layer.weight[:, 1] = layer.weight[:, 0]
    layer.eval()
    s = singular_values(layer, (4, 4, 4))
    bound = layer.lipschitz_upper_bound()
    assert float(s.max()) <= bound <= 2 ** 0.5 + 1e-9
    assert float(s.max()) <= 1 + 1e-9


def test_ridge_zero_is_the_exact_reflector():
    torch.manual_seed(3)
    plain = BROConv(4, 8, 3, 2, border="zero", init="random").eval()
    zero = BROConv(4, 8, 3, 2, border="zero", ridge=0.0).eval()
    zero.load_state_dict(plain.state_dict())
    x = torch.randn(2, 4, 6, 6)
    assert torch.equal(plain(x), zero(x)) and "ridge" not in repr(zero)
    with pytest.raises(ValueError, match="ridge"):
        BROConv(4, 4, ridge=1.0)
