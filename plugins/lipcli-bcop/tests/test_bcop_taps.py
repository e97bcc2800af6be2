"""``bcop:taps=authors``: the BCOP authors' tap layout (each tap's matrix transposed when
``in·s² ≤ out``) is still an orthogonal convolution with a verified bound, and the default
layout is unchanged."""

from __future__ import annotations

import pytest
import torch

from lipcli_bcop.bcop import BCOPConv


def _pair(c_in: int, c_out: int, k: int, s: int) -> tuple[BCOPConv, BCOPConv]:
    torch.manual_seed(0)
    ours = BCOPConv(c_in, c_out, k, s)
    theirs = BCOPConv(c_in, c_out, k, s, taps="authors")
    theirs.load_state_dict(ours.state_dict())
    return ours.eval(), theirs.eval()


@pytest.mark.parametrize("c_in, c_out, k, s, transposed", [
    (4, 4, 3, 1, True), (2, 8, 3, 2, True), (3, 2, 3, 1, False), (4, 16, 1, 2, True), (6, 4, 1, 1, False)])
def test_authors_taps_are_transposed_where_in_is_at_most_out(c_in, c_out, k, s, transposed):
    ours, theirs = _pair(c_in, c_out, k, s)
    a, b = ours.eval_operator(None), theirs.eval_operator(None)
    if not transposed:
        assert torch.equal(a, b)
        return
    assert not torch.allclose(a, b)
    torch.manual_seed(0)
    full = BCOPConv(c_out, c_in * s * s, k, 1)  # K(z) on c channels, sliced the other way
    full.load_state_dict(ours.state_dict())
    assert torch.allclose(b, full.eval().eval_operator(None).transpose(0, 1))


def test_authors_taps_keep_the_layer_orthogonal():
    """``K(z)ᵀ`` is paraunitary: the map keeps norms on a torus (square layer), and the
    verified bound stays about 1."""
    _ours, theirs = _pair(6, 6, 3, 1)
    x = torch.randn(5, 6, 8, 8, dtype=torch.float64)
    theirs = theirs.double()
    with torch.no_grad():
        y = theirs(x) - theirs.bias.view(1, -1, 1, 1)
    assert torch.allclose(y.flatten(1).norm(dim=1), x.flatten(1).norm(dim=1), rtol=1e-8)
    assert 1.0 <= theirs.lipschitz_upper_bound() < 1.0 + 1e-6


def test_taps_is_checked():
    with pytest.raises(ValueError, match="taps must be one of"):
        BCOPConv(4, 4, 3, taps="transposed")
