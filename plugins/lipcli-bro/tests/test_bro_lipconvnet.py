"""The architecture ``bronet-lipconvnet-<n>`` (the BRONet authors' LipConvNet): layout as
``lipconvnet/models/lip_convnets.py`` builds it (channels, kernels, strides; saving and loading
is tested through ``lip import`` in test_bro_import.py), and the guaranteed bound covers the dense float64 Jacobian of the features."""

from __future__ import annotations

import pytest
import torch

from lipcli.testing import create_model, guaranteed_upper_bound
from lipcli_bro.lipconvnet import layer_plan

AUTHORS_CONV = "bro:rank_ratio=0.5,rank_rule=lipconvnet,border=zero,ridge=1e-5,init=random"


def test_layer_plan_is_the_authors_layout():
    # LipConvNet(block_size=2, init_channels=4): LipBlock(3, 4, s1), LipBlock(4, 4, s2) -> 8, ...
    assert layer_plan(2, 4) == [
        ("layer1_conv1", 3, 4, 3, 1), ("layer1_conv2", 4, 8, 3, 2),
        ("layer2_conv1", 8, 8, 3, 1), ("layer2_conv2", 8, 16, 3, 2),
        ("layer3_conv1", 16, 16, 3, 1), ("layer3_conv2", 16, 32, 3, 2),
        ("layer4_conv1", 32, 32, 3, 1), ("layer4_conv2", 32, 64, 3, 2),
        ("layer5_conv1", 64, 64, 3, 1), ("layer5_conv2", 64, 128, 1, 2)]
    # block_size 1: the first layer is 3 -> 2w with stride 2
    assert layer_plan(1, 4)[0] == ("layer1_conv1", 3, 8, 3, 2) and len(layer_plan(3, 4)) == 15


def test_model_layout_and_features():
    model = create_model("bronet-lipconvnet-10", conv=AUTHORS_CONV, head="lln", width=2, num_classes=10)
    names = [n for n, _ in model.body.named_children()]
    assert names[:3] == ["normalize", "layer1_conv1", "layer1_act1"] and names[-1] == "flatten"
    assert len(names) == 2 + 2 * 10 and model.feature_dim == 64
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    big = create_model("bronet-lipconvnet-5", conv=AUTHORS_CONV, head="lln", width=2, image_size=(64, 64))
    assert big.feature_dim == 4 * 64 and big.features(torch.rand(1, 3, 64, 64)).shape == (1, 256)
    with pytest.raises(ValueError, match="multiple of 32"):
        create_model("bronet-lipconvnet-5", conv=AUTHORS_CONV, head="lln", width=2, image_size=(48, 48))


def test_bound_covers_the_dense_jacobian():
    torch.manual_seed(0)
    model = create_model("bronet-lipconvnet-5", conv=AUTHORS_CONV, head="lln", width=2).double().eval()
    x = torch.rand(1, 3, 32, 32, dtype=torch.float64)
    model.features(x)  # the layers record their sizes
    bound, _rows = guaranteed_upper_bound(model)
    jac = torch.autograd.functional.jacobian(lambda t: model.features(t)[0], x).reshape(-1, x.numel())
    norm = float(torch.linalg.matrix_norm(jac, ord=2))
    assert 0 < norm <= bound <= (1 / 0.2507) * 1.01
