"""The SLL authors' networks ``sll-small`` .. ``sll-xlarge``: the sizes are the authors'
(``main.py`` / ``reproduce_tables.py`` of ``araujoalexandre/Lipschitz-SLL-Networks``), the
layout, the sum pool's norm, and the guaranteed bound above the dense float64 Jacobian of a
tiny instance."""

from __future__ import annotations

import pytest
import torch

import lipcli_sll.plugin as plugin
from lipcli.host.models import create_model
from lipcli.lipschitz.bound import guaranteed_upper_bound
from lipcli_sll import SLLConv
from lipcli_sll.network import SumPool4

#: (name, depth, dense, width, dense_hidden) as read from the authors' main.py `override_args`
AUTHORS = [("sll-small", 20, 7, 45, 2048), ("sll-medium", 30, 10, 60, 2048),
           ("sll-large", 50, 10, 90, 2048), ("sll-xlarge", 70, 15, 120, 2048)]


@pytest.mark.parametrize("name, depth, dense, width, hidden", AUTHORS)
def test_presets_are_the_authors_sizes(name, depth, dense, width, hidden):
    spec = {s.name: s for s in plugin.network_specs()}[name]
    params = spec.resolve_params({})
    assert (params["depth"], params["dense"], params["width"], params["dense_hidden"]) == (depth, dense, width, hidden)
    assert params["q_init"] == "normal"


def tiny(**params):
    torch.manual_seed(0)
    return create_model("sll-small", conv="sll:hidden=3,q_init=normal", head="lln", image_size=(8, 8),
                        depth=3, dense=2, width=4, dense_hidden=6, **params).double().eval()


def test_layout():
    model = tiny()
    names = [n for n, _ in model.body.named_children()]
    assert names == ["normalize", "conv1", "conv2", "conv3", "pool", "to_vector", "dense1", "dense2", "flatten"]
    assert tuple(model.body.conv1.weight.shape) == (3, 4, 3, 3)  # 3 -> 4 channels: padded, 3 hidden
    dense = model.body.dense1
    assert isinstance(dense, SLLConv) and tuple(dense.weight.shape) == (6, 16, 1, 1)
    assert bool((dense.log_q != 0).any()) and model.feature_dim == 16
    assert model(torch.rand(2, 3, 8, 8, dtype=torch.float64)).shape == (2, 10)
    with pytest.raises(ValueError, match="divisible by 4"):
        create_model("sll-small", conv="sll", image_size=(30, 30), depth=1, dense=0, width=2)


def test_sum_pool_is_one_lipschitz_and_tight():
    x = torch.randn(1, 2, 8, 8, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(SumPool4(), x).reshape(2 * 4, 2 * 64)
    s = torch.linalg.svdvals(jac)
    torch.testing.assert_close(s, torch.ones_like(s), rtol=0, atol=1e-12)
    torch.testing.assert_close(SumPool4()(x), torch.nn.AvgPool2d(4, divisor_override=4)(x), rtol=0, atol=1e-12)


def test_bound_covers_the_dense_jacobian():
    model = tiny()
    gen = torch.Generator().manual_seed(2)
    bound, rows = guaranteed_upper_bound(model)
    assert {r.name for r in rows} >= {"conv1", "dense2", "pool"}
    norms = []
    for _ in range(4):
        x = torch.rand(1, 3, 8, 8, generator=gen, dtype=torch.float64)
        jac = torch.autograd.functional.jacobian(model.features, x).reshape(16, -1)
        norms.append(float(torch.linalg.matrix_norm(jac, ord=2)))
    assert max(norms) <= bound
    assert max(norms) > 0.1 * bound  # not a vacuous comparison
