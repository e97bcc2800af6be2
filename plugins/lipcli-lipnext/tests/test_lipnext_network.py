"""The ``lipnext`` architecture: conformance of its specs, the network's guaranteed bound at
least the float64 Jacobian norm of its features (also off the manifold), model-file round trip."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.functional import jacobian

import lipcli.testing as checks
from lipcli.sdk.orthogonal import orthogonal_parameters
from lipcli.testing import create_model, guaranteed_upper_bound, load_model, save_model
from lipcli_lipnext import plugin


@pytest.fixture(scope="module", autouse=True)
def registered():
    with checks.registered(("test-lipnext", plugin)):
        yield


def test_specs_conform():
    from lipcli_lipnext.optimizer import so_adam_spec

    for spec in (plugin.lipnext_spec(), so_adam_spec()):
        checks.check_component_spec(spec)
        checks.check_param_ranges(spec, require=True)


def tiny(**params):
    torch.manual_seed(0)
    return create_model("lipnext", num_classes=5, image_size=(8, 8), depth=2, width=8,
                        shift_ratio=0.25, **params).double().eval()


@pytest.mark.parametrize("off", [0.0, 0.02])
def test_guaranteed_bound_covers_the_float64_jacobian(off):
    model = tiny()
    declared = orthogonal_parameters(model)
    assert [p.name for p in declared] == ["body.stem.weight", "body.block1.R", "body.block1.M",
                                          "body.block2.R", "body.block2.M"]
    with torch.no_grad():
        for p in declared:
            p.param.add_(off * torch.randn_like(p.param))
        for name, p in model.named_parameters():
            if "pos" in name or "bias" in name:
                p.normal_()
    bound, _ = guaranteed_upper_bound(model)
    for seed in range(3):
        x = torch.rand(1, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        J = jacobian(lambda t: model.features(t), x).reshape(8, -1)
        norm = float(torch.linalg.matrix_norm(J, ord=2))
        assert bound >= norm
    assert bound > 1.0  # 1/min std times the layers' bounds, never assumed


def test_model_file_round_trip(tmp_path):
    model = tiny().float()
    path = save_model(model, tmp_path / "m.safetensors", dataset=None)
    loaded, _ = load_model(path)
    x = torch.rand(3, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))
    assert [p.name for p in orthogonal_parameters(loaded)] == [p.name for p in orthogonal_parameters(model)]


def test_bad_shapes_are_refused():
    with pytest.raises(Exception, match="multiple of patch"):
        create_model("lipnext", num_classes=5, image_size=(9, 9), depth=1, width=4)
