"""SLL's hidden channel count (``hidden``) and the authors' random ``q`` initialisation
(``q_init="normal"``): shapes, the draws, the default unchanged, and the verified bound against
dense Jacobians and pair ratios at the authors' initialisation and with fewer hidden channels
than channels (the authors' 5 hidden channels on 45 to 120)."""

from __future__ import annotations

import pytest
import torch

import lipcli_sll.plugin as plugin
from lipcli.testing import check_conv_spec
from lipcli.testing.conv import jacobian_singular_values, pair_ratio
from lipcli_sll import SLLConv, SLLDense


def worst(layer, shape, seed):
    gen = torch.Generator().manual_seed(seed)
    svals = jacobian_singular_values(layer, shape, torch.float64, gen, points=4)
    return max(max(float(v.max()) for v in svals), pair_ratio(layer, shape, gen, pairs=12))


def test_hidden_count_sets_the_hidden_channels():
    assert tuple(SLLConv(45, 45, 3, 1, hidden=5).weight.shape) == (5, 45, 3, 3)
    assert tuple(SLLConv(4, 16, 3, 2, hidden=7).weight.shape) == (7, 16, 3, 3)
    assert tuple(SLLConv(4, 4, 3, 1).weight.shape) == (4, 4, 3, 3)  # default: inner_factor 1
    with pytest.raises(ValueError, match="not both"):
        SLLConv(4, 4, 3, 1, hidden=3, inner_factor=2)
    with pytest.raises(ValueError, match="hidden"):
        SLLConv(4, 4, 3, 1, hidden=-1)
    with pytest.raises(ValueError, match="q_init"):
        SLLConv(4, 4, 3, 1, q_init="uniform")


def test_q_init_draws_after_the_other_parameters_and_default_is_unchanged():
    """``ones`` draws nothing for ``log_q`` (the default's random stream is as before);
    ``normal`` draws ``log_q ~ N(0, 1)`` after the filter and bias, which stay the same."""
    torch.manual_seed(0)
    ones = SLLConv(8, 8, 3, 1)
    after_ones = torch.rand(1)
    torch.manual_seed(0)
    normal = SLLConv(8, 8, 3, 1, q_init="normal")
    assert torch.equal(ones.weight, normal.weight) and torch.equal(ones.bias, normal.bias)
    assert torch.equal(ones.log_q, torch.zeros(8))
    torch.manual_seed(0)
    torch.empty(8, 8, 3, 3).normal_()  # xavier_normal_ of the filter: one normal draw
    torch.empty(8).uniform_()  # the bias
    assert torch.equal(normal.log_q.detach(), torch.randn(8))
    torch.manual_seed(0)
    SLLConv(8, 8, 3, 1)
    assert torch.equal(torch.rand(1), after_ones)
    big = SLLDense(4, 4096, q_init="normal").log_q.detach()
    assert abs(float(big.mean())) < 0.1 and abs(float(big.std()) - 1) < 0.1
    assert torch.equal(SLLDense(4, 6).log_q.detach(), torch.zeros(6))


@pytest.mark.parametrize("cin, cout, k, stride, size, hidden", [
    (6, 6, 3, 1, 5, 2), (4, 16, 3, 2, 4, 3), (8, 8, 1, 1, 1, 3), (3, 6, 3, 1, 4, 9)])
def test_authors_initialisation_and_few_hidden_channels_stay_below_the_bound(cin, cout, k, stride, size, hidden):
    """The layer as the authors initialise it (Xavier filter, uniform bias, ``log_q ~ N(0, 1)``)
    with a hidden count below or above the channels, and after a few Adam steps."""
    torch.manual_seed(cin + cout + hidden)
    layer = SLLConv(cin, cout, k, stride, hidden=hidden, q_init="normal").double()
    shape = (cin, size, size)
    opt = torch.optim.Adam(layer.parameters(), lr=0.1)
    for step in range(4):
        layer.eval()
        bound = layer.lipschitz_upper_bound()
        assert bound <= 1 + 1e-9
        assert 0.99 < worst(layer, shape, seed=step) <= bound * (1 + 1e-12)
        layer.train()
        opt.zero_grad()
        x = torch.randn(4, *shape, dtype=torch.float64)
        (-(layer(x) ** 2).mean()).backward()  # push towards expansion
        opt.step()


def test_dense_authors_initialisation_below_the_bound():
    torch.manual_seed(0)
    layer = SLLDense(12, 5, q_init="normal").double().eval()
    gen = torch.Generator().manual_seed(1)
    bound = layer.lipschitz_upper_bound()
    for _ in range(4):
        x = torch.randn(12, generator=gen, dtype=torch.float64)
        jac = torch.autograd.functional.jacobian(layer, x)
        assert float(torch.linalg.matrix_norm(jac, ord=2)) <= bound <= 1 + 1e-9


def test_spec_params_and_conformance():
    spec = plugin.sll_spec()
    params = spec.resolve_params({"hidden": 5, "q_init": "normal"})
    layer = spec.factory(4, 4, 3, 1, **params)
    assert tuple(layer.weight.shape) == (5, 4, 3, 3) and bool((layer.log_q != 0).any())
    assert spec.resolve_params({})["hidden"] == 0 and spec.resolve_params({})["q_init"] == "ones"
    reports = check_conv_spec(spec, params={"hidden": 3, "q_init": "normal"})
    assert len(reports) == 7 and all(r.sigma_max <= r.bound <= 1 + 1e-9 for r in reports)
