"""The ``bronet`` architecture (the BRONet authors' backbone network, :mod:`lipcli_bro.bronet`):
layout, the network bound against the dense float64 Jacobian, the Cholesky layers'
contraction, the training estimate and the export lowering of its own layers."""

from __future__ import annotations

import pytest
import torch

from lipcli.testing import create_model, guaranteed_upper_bound
from lipcli_bro.bronet_layers import CholeskyLinear, CholeskyPatchConv, StemConv, cholesky_orthogonal

ARCH = "bronet:depth=2,width=4,stem_kernel=5,neck_patch=4,dense=2,dense_width=8"
CONV = "bro:border=zero,ridge=1e-7"


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = create_model(ARCH, conv=CONV, head="lln", num_classes=10)
    with torch.no_grad():  # move away from the identity starts
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def test_layout():
    model = _model(0)
    names = list(model.body._modules)
    assert names[:3] == ["normalize", "stem_conv", "stem_act"]
    assert names[-6:] == ["neck_dense", "neck_act", "dense1", "dense1_act", "dense2", "dense2_act"]
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="divisible by 2\\*neck_patch"):
        create_model("bronet:width=4,dense_width=8,neck_patch=3", conv=CONV, head="lln")


@pytest.mark.parametrize("seed", [0, 1])
def test_bound_covers_the_dense_jacobian(seed):
    model = _model(seed).double().eval()
    x = torch.rand(1, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    model.features(x)  # the BRO layers record their sizes
    bound, _layers = guaranteed_upper_bound(model)
    jac = torch.autograd.functional.jacobian(lambda t: model.features(t)[0], x).reshape(-1, x.numel())
    assert float(torch.linalg.matrix_norm(jac, ord=2)) <= bound


def test_cholesky_layers_are_contractions_and_bounded():
    """``L⁻¹X`` has singular values at most 1 for square, wide and tall ``X``; the layer's
    bound covers the float64 norm and exceeds 1 by at most its certificate's tolerance."""
    torch.manual_seed(0)
    for shape in ((8, 8), (4, 12), (12, 4)):
        X = torch.randn(*shape, dtype=torch.float64) * 5
        W = cholesky_orthogonal(X)
        assert float(torch.linalg.matrix_norm(W, ord=2)) <= 1.0
        layer = CholeskyLinear(shape[1], shape[0]).double()
        with torch.no_grad():
            layer.weight.copy_(X)
        norm = float(torch.linalg.matrix_norm(layer.matrix().detach(), ord=2))
        assert norm <= layer.lipschitz_upper_bound() < 1 + 1e-4


def test_export_modules_compute_the_layers():
    torch.manual_seed(0)
    for layer, x in ((StemConv(3, 4, 5, (8, 8)), torch.randn(2, 3, 8, 8)),
                     (CholeskyPatchConv(4, 2), torch.randn(2, 4, 8, 8)),
                     (CholeskyLinear(6, 4), torch.randn(3, 6))):
        layer.eval()
        with torch.no_grad():
            assert torch.allclose(layer.export_module()(x), layer(x), rtol=1e-5, atol=1e-6), type(layer).__name__


def test_training_estimate_approaches_the_stem_norm():
    """The training estimate is the authors' power iteration: after refreshing, it is
    ``1/min std`` times a value close below the stem's guaranteed bound."""
    model = _model(2).train()
    model.refresh_power_iteration(200)
    estimate = float(model.lipschitz_training_estimate().detach()) / model.input_lipschitz
    bound = model.body.stem_conv.lipschitz_upper_bound()
    assert 0.9 * bound <= estimate <= bound
