"""The ``bronet`` architecture (the BRONet authors' backbone network, :mod:`lipcli_bro.bronet`):
layout, the network bound against the dense float64 Jacobian, the training estimate and the
export of the whole network (the stem and Cholesky layers themselves: lipcli's
tests/sdk/test_free_conv.py and tests/sdk/test_cholesky.py)."""

from __future__ import annotations

import pytest
import torch

from lipcli.testing import create_model, guaranteed_upper_bound
from lipcli_liresnet.cholesky import CholeskyLinear
from lipcli_liresnet.free_conv import FreeConv

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


def test_layer_types():
    model = _model(0)
    assert isinstance(model.body.stem_conv, FreeConv) and model.body.stem_conv.stride == 2
    assert model.body.stem_conv.power_steps == 10  # the authors' num_lc_iter
    assert sum(isinstance(m, CholeskyLinear) for m in model.modules()) == 3  # neck dense + 2 dense


def test_training_estimate_approaches_the_stem_norm():
    """The training estimate is the authors' power iteration: after refreshing, it is
    ``1/min std`` times a value close below the stem's guaranteed bound."""
    model = _model(2).train()
    model.refresh_power_iteration(200)
    estimate = float(model.lipschitz_training_estimate().detach()) / model.input_lipschitz
    bound = model.body.stem_conv.lipschitz_upper_bound()
    assert 0.9 * bound <= estimate <= bound
