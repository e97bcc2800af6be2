"""``lipresnet-<n>``: LipConvnet-n with the LOT authors' convex-combination residuals.

The layout (which pairs become residuals; LipResNet-10 is LipConvnet-10), the forward
(``λx + (1 − λ)·act(conv(x))``), the bound formula ``a + c·Π U_j`` (tight on a scaling, and
above the dense float64 Jacobian of a whole tiny network at several points), the stand-in and
the arch parameters.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lipcli.host.models import create_model
from lipcli_lot.resnet import AUTHORS_MIX, ConvexResidual, mix_weights, residual_pairs


def tiny(arch: str, **params) -> nn.Module:
    torch.manual_seed(0)
    return create_model(arch, conv="lot", width=2, **params).double().eval()


def test_residual_pairs_are_the_authors_hidden_blocks():
    names = ["stem_conv", "stem_act", "block1_conv1", "block1_act1", "block1_conv2", "block1_act2",
             "block1_conv3", "block1_act3", "block1_down", "block1_pool", "block5_down",
             "block5_act1", "block5_conv1", "block5_act2", "block5_conv2", "block5_pool"]
    assert residual_pairs(names) == {"block1_conv2": ("block1_res2", "block1_act2"),
                                     "block1_conv3": ("block1_res3", "block1_act3"),
                                     "block5_act2": ("block5_res2", "block5_conv2")}


def test_lipresnet_10_is_lipconvnet_10_and_20_has_two_residuals_per_block():
    plain, res10 = tiny("lipconvnet-10"), tiny("lipresnet-10")
    assert list(plain.state_dict()) == list(res10.state_dict())
    res20 = tiny("lipresnet-20")
    residuals = [n for n, m in res20.body.named_children() if isinstance(m, ConvexResidual)]
    assert residuals == [f"block{b}_res{i}" for b in range(1, 6) for i in (2, 3)]
    assert all(m.mix == AUTHORS_MIX for m in res20.body.modules() if isinstance(m, ConvexResidual))
    names = [row[0] for row in res20.describe()]
    assert names == [n for n, _ in res20.body.named_children()] + ["head"]
    x = torch.rand(2, 3, 32, 32, dtype=torch.float64)
    assert res20(x).shape == (2, 10)


def test_forward_is_the_convex_combination():
    block = tiny("lipresnet-15").body.block2_res2
    x = torch.randn(2, *block.inner[0].weight.shape[1:2], 8, 8, dtype=torch.float64)
    conv, act = block.inner
    torch.testing.assert_close(block(x), 0.5 * x + 0.5 * act(conv(x)), rtol=0, atol=0)
    stand_in = block.export_module()
    torch.testing.assert_close(stand_in(x), block(x), rtol=0, atol=1e-12)


class _Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return self.factor * x

    def lipschitz_upper_bound(self) -> float:
        return self.factor


@pytest.mark.parametrize("mix, factor", [(0.5, 2.0), (0.25, 3.0), (0.9, 0.5), (0.1, 1.0)])
def test_bound_is_mix_plus_branch_bound_and_tight_on_a_scaling(mix, factor):
    block = ConvexResidual(nn.Sequential(_Scale(factor)), mix)
    exact = mix + (1 - mix) * factor  # the map is exact * I
    bound = block.lipschitz_upper_bound()
    assert exact <= bound <= exact * (1 + 1e-7)
    x = torch.randn(5, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(block, x)
    assert float(torch.linalg.matrix_norm(jac, ord=2)) <= bound
    a, c = mix_weights(mix)
    assert a >= mix and c >= 1 - mix


def test_a_layer_without_a_bound_is_refused():
    with pytest.raises(Exception, match="neither"):
        ConvexResidual(nn.Sequential(nn.Linear(3, 3)), 0.5).lipschitz_upper_bound()
    with pytest.raises(ValueError, match="mix"):
        ConvexResidual(nn.Sequential(_Scale(1.0)), 1.5)


@pytest.mark.parametrize("mix", [AUTHORS_MIX, 0.2])
def test_network_bound_covers_the_dense_jacobian(mix):
    """Dense float64 Jacobian of the features of a tiny LipResNet-15 (width 2; random LOT
    filters, so the convolutions are not the identity) at three points: its spectral norm is
    at most the network's guaranteed bound."""
    model = tiny("lipresnet-15", mix=mix)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "weight") and m.weight.dim() == 4:
                m.weight.add_(0.3 * torch.randn(m.weight.shape, generator=gen, dtype=m.weight.dtype))
    with torch.no_grad():
        model(torch.rand(1, 3, 32, 32, dtype=torch.float64))  # Fourier layers record the size
    bound = model.lipschitz_upper_bound()
    residual = model.body.block3_res2.lipschitz_upper_bound()
    assert residual <= 1 + 1e-9
    norms = []
    for _ in range(3):
        x = torch.rand(1, 3, 32, 32, generator=gen, dtype=torch.float64)
        jac = torch.autograd.functional.jacobian(model.features, x)
        norms.append(float(torch.linalg.matrix_norm(jac.reshape(jac.shape[1], -1), ord=2)))
    assert max(norms) <= bound
    assert max(norms) > 0.1 * bound  # not a vacuous comparison
