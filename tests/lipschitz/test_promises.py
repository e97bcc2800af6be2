"""Promises are checked with the parameters in use: a pool whose learnable scale starts at 1
passes the checks at initialisation but not after its scale moved -- ``lipcli.testing`` fails
it (perturbed parameters) and ``lip certify`` / ``lip lipschitz`` refuse the trained model
(exit 1, "plugin ... breaks its 1-Lipschitz promise (measured r)") instead of printing a
GUARANTEED bound.  A 0-d parameter passes the conformance checks when its promise holds,
trains, and no longer crashes the final write of ``lip train``."""

from __future__ import annotations

import json
import re
import types

import pytest
import torch
from torch import nn
from typer.testing import CliRunner


from lipcli.sdk.hookspecs import hookimpl
from lipcli.host import plugins
from lipcli.cli import app
from lipcli.host.models import create_model, save_model
from lipcli.lipschitz.promises import (
    PROMISE_TOL, BrokenPromiseError, capture_inputs, layer_ratio, perturbed_copies, verify_promises,
)
from lipcli.sdk.specs import ONE_LIPSCHITZ, PoolSpec
from lipcli.testing import check_pool_spec

runner = CliRunner()
DIGITS = {"name": "digits", "params": {}, "num_classes": 10}


class ScaledMaxPool(nn.Module):
    """Channel-pair max times a learnable scale: 1-Lipschitz only while |scale| <= 1."""

    def __init__(self, channels: int, zero_dim: bool = False) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.0) if zero_dim else torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.maximum(x[:, 0::2], x[:, 1::2]) * self.scale


def scaled_spec() -> PoolSpec:
    return PoolSpec(name="scaled", factory=ScaledMaxPool, promises=(ONE_LIPSCHITZ,),
                    description="channel-pair max times a learnable scale (a FALSE promise)")


def scalar_spec() -> PoolSpec:
    return PoolSpec(name="scalar0d", factory=lambda channels: ScaledMaxPool(channels, zero_dim=True),
                    promises=(ONE_LIPSCHITZ,), description="scaled max with a 0-d parameter")


@pytest.fixture
def scaled_plugin():
    module = types.ModuleType("scaled_pool_plugin")
    module.lip_pools = hookimpl(lambda: [scaled_spec(), scalar_spec()])
    module.lip_pools.__name__ = "lip_pools"
    plugins.register_plugin(module, "scaledpool")
    yield
    plugins.unregister_plugin("scaledpool")
    plugins.reset()


def _model_file(path, scale: float, pool: str = "scaled"):
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, pool=pool)
    model.refresh_power_iteration(10)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, ScaledMaxPool):
                module.scale.fill_(scale)
    save_model(model, path, dataset=DIGITS)
    return path


def test_a_learnable_scale_fails_the_conformance_checks():
    with pytest.raises(AssertionError, match=r"pool 'scaled' with .* is not 1-Lipschitz"):
        check_pool_spec(scaled_spec(), channels=4)


def test_perturbed_copies_move_every_parameter():
    module = ScaledMaxPool(4)
    copies = dict(perturbed_copies(module, (4, 2, 2)))
    assert len(copies) == 4
    for moved in copies.values():
        assert moved.scale.dtype == torch.float64 and float(moved.scale.detach()) != 1.0
    assert float(copies["negative parameters"].scale.detach()) < 0
    assert float(module.scale.detach()) == 1.0  # the original is untouched


class BoundedScalarPool(nn.Module):
    """Channel-pair max times tanh(s) with a 0-d parameter s: 1-Lipschitz for every s."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.maximum(x[:, 0::2], x[:, 1::2]) * torch.tanh(self.s)


def test_a_zero_dimensional_parameter_is_handled_by_the_conformance_checks():
    spec = PoolSpec(name="tanhscale", factory=BoundedScalarPool, promises=(ONE_LIPSCHITZ,),
                    description="max times tanh of a 0-d parameter")
    assert check_pool_spec(spec, channels=4).num_parameters == 1


@pytest.mark.parametrize("command", [["certify", "--no-write", "--limit", "16"], ["lipschitz", "--no-estimate"]])
def test_certify_and_lipschitz_refuse_a_broken_promise(scaled_plugin, tmp_path, command):
    path = _model_file(tmp_path / "m.safetensors", -1.3)
    r = runner.invoke(app, [command[0], str(path), *command[1:]])
    assert r.exit_code == 1, r.output
    line = r.stderr.strip()
    assert line.startswith("error: plugin scaledpool (distribution (in-process)) breaks its "
                           "1-Lipschitz promise (measured 1.3"), line
    assert "pool 'scaled' at layer 'block1_pool'" in line
    assert "GUARANTEED" not in r.stdout and r.stdout == ""


def test_a_kept_promise_certifies_and_reports_the_check(scaled_plugin, tmp_path):
    path = _model_file(tmp_path / "m.safetensors", 0.5)
    r = runner.invoke(app, ["certify", str(path), "--no-write", "--limit", "16", "--json"])
    assert r.exit_code == 0, r.output
    checked = json.loads(r.stdout)["promises"]
    names = [row["layer"] for row in checked["layers"]]
    assert "block1_pool" in names and "stem_act" in names and "flatten" in names
    assert 0.49 < next(row["max_ratio"] for row in checked["layers"] if row["layer"] == "block1_pool") <= 0.5 + 1e-9
    assert checked["max_ratio"] <= 1 + 1e-6 and checked["points"] == 8
    assert "evidence, not proof" in checked["label"]


def test_builtin_promises_measure_one_and_a_violation_is_found_at_data_points():
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, pool="projection")
    model.refresh_power_iteration(5)
    check = verify_promises(model)
    assert 0.9 < check.max_ratio <= 1 + 1e-6
    x = torch.randn(4, 8, 2, 2)
    assert layer_ratio(nn.Identity(), x) == pytest.approx(1.0, abs=1e-9)
    # a map that stretches one coordinate of 32 by 2: random pairs miss it, the power
    # iteration finds it
    twice = nn.Sequential(nn.Flatten(1), nn.Linear(32, 32, bias=False))
    with torch.no_grad():
        twice[1].weight.copy_(torch.eye(32))
        twice[1].weight[3, 3] = 2.0
    assert layer_ratio(twice, x) == pytest.approx(2.0, rel=1e-6)  # found by the power iteration


class StretchOne(nn.Module):
    """The identity except that one coordinate is multiplied by ``factor``: Lipschitz
    constant ``factor``, reached in that one direction only."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.flatten(1).clone()
        y[:, 3] = y[:, 3] * self.factor
        return y.view_as(x)


@pytest.mark.parametrize("shape", [(32,), (8, 16, 16)])  # 32 and 2048 coordinates
def test_a_one_percent_stretch_in_one_direction_is_caught(shape):
    """The default settings (8 points, 8 power steps) find a constant of 1.01 that only one
    direction of the input space shows; an exact isometry of the same shape measures 1."""
    x = torch.randn((8, *shape), generator=torch.Generator().manual_seed(1))
    assert 1 + PROMISE_TOL < layer_ratio(StretchOne(1.01), x) <= 1.01 + 1e-12
    assert layer_ratio(StretchOne(1.0), x) == pytest.approx(1.0, abs=1e-12)
    assert layer_ratio(StretchOne(0.5), x) <= 1 + 1e-12  # a contraction is not flagged


def test_a_scale_of_1_01_breaks_the_promise_in_a_model(scaled_plugin):
    """A learnable scale only 1 % above 1 is caught in the network, at the inputs each
    layer receives (recorded during a forward pass, as lip certify does)."""
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, pool="scaled").eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, ScaledMaxPool):
                module.scale.fill_(1.01)
    x = torch.rand(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with capture_inputs(model) as inputs, torch.no_grad():
        model(x)
    with pytest.raises(BrokenPromiseError, match=r"measured 1\.01\b.*'block1_pool'"):
        verify_promises(model, inputs=inputs)


def test_broken_promise_error_is_a_runtime_error():
    assert BrokenPromiseError("x").exit_code == 1


def test_a_zero_dimensional_parameter_trains_and_is_written(scaled_plugin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text("power_iter_steps = 3\n")
    r = runner.invoke(app, ["train", "--dataset", "digits", "--width", "4", "--pool", "scalar0d",
                            "--limit-train", "32", "--limit-test", "16", "--batch-size", "16",
                            "--epochs", "1", "--device", "cpu", "-q", "--no-lipschitz-estimate",
                            "--config", "t.toml", "--out", "m.safetensors"])
    assert r.exit_code == 0, r.output
    from lipcli.host.modelfile import read_model_file

    assert read_model_file("m.safetensors").tensors["body.block1_pool.scale"].shape == ()


class _ScaledMaxExport(nn.Module):
    """What a ScaledMaxPool lowers to in an exported program (its scale as a buffer)."""

    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.maximum(x[:, 0::2], x[:, 1::2]) * self.scale


@pytest.mark.usefixtures("memo_soc_build")  # the program and its check lower the same SOC layers
@pytest.mark.parametrize("scale", [-1.3, 0.5])
def test_export_certify_refuses_a_broken_promise(scaled_plugin, tmp_path, monkeypatch, scale):
    """``lip export --certify`` measures the promises as ``lip certify`` does: a broken one
    is the same error (exit 1) and nothing is written; a kept one exports."""
    monkeypatch.setattr(ScaledMaxPool, "export_module",
                        lambda self: _ScaledMaxExport(self.scale.detach().clone()), raising=False)
    path = _model_file(tmp_path / "m.safetensors", scale)
    out = tmp_path / "m.pt"
    r = runner.invoke(app, ["export", str(path), "--certify", "--check", "4", "--format",
                            "torchscript", "--output", str(out), "--json"])
    if scale > 0:
        assert r.exit_code == 0, r.output
        assert out.exists() and json.loads(r.stdout)["lipschitz_upper_bound"] > 0
        return
    assert r.exit_code == 1, r.output
    line = r.stderr.strip()
    assert line.startswith("error: plugin scaledpool (distribution (in-process)) breaks its "
                           "1-Lipschitz promise (measured 1.3"), line
    assert "pool 'scaled' at layer 'block1_pool'" in line
    assert r.stdout == "" and not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


def test_train_with_a_broken_promise_keeps_the_weights_but_no_guaranteed_bound(
        scaled_plugin, tmp_path, monkeypatch):
    """``lip train`` measures the promises before it records the bound: a broken one is a
    warning on stderr, the model file is written with ``upper_bound`` null (and the reason),
    ``lip info`` shows no GUARANTEED number and ``lip certify`` still refuses the model."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ScaledMaxPool, "__init__", _init_scale(-1.3))
    (tmp_path / "t.toml").write_text("power_iter_steps = 3\n")
    r = runner.invoke(app, ["train", "--dataset", "digits", "--width", "4", "--pool", "scaled",
                            "--limit-train", "32", "--limit-test", "16", "--batch-size", "16",
                            "--epochs", "1", "--device", "cpu", "-q", "--no-lipschitz-estimate",
                            "--config", "t.toml", "--out", "m.safetensors", "--json"])
    assert r.exit_code == 0, r.output
    found = re.search(r"warning: plugin scaledpool \(distribution \(in-process\)\) breaks its "
                      r"1-Lipschitz promise \(measured ([0-9.]+)\)", r.stderr)
    assert found and float(found.group(1)) > 1.1, r.stderr  # the scale started at -1.3
    assert json.loads(r.stdout)["lipschitz_upper_bound"] is None
    from lipcli.host.modelfile import read_model_file

    stored = read_model_file("m.safetensors").metadata["lipschitz"]
    assert stored["upper_bound"] is None and "breaks its 1-Lipschitz promise" in stored["promise_broken"]
    assert "GUARANTEED" not in stored["upper_bound_label"]
    info = runner.invoke(app, ["info", "m.safetensors"])
    assert info.exit_code == 0, info.output
    assert "GUARANTEED" not in info.stdout and "a 1-Lipschitz promise is broken" in info.stdout
    cert = runner.invoke(app, ["certify", "m.safetensors", "--no-write", "--limit", "8"])
    assert cert.exit_code == 1 and "breaks its 1-Lipschitz promise" in cert.stderr


def _init_scale(value: float):
    def init(self: ScaledMaxPool, channels: int, zero_dim: bool = False) -> None:
        nn.Module.__init__(self)
        self.scale = nn.Parameter(torch.full((1,), value))
    return init


class ScaledHead(nn.Module):
    """The first ``num_classes`` features times ``scale``: 1-Lipschitz only while
    ``|scale| <= 1``; promises 1 and has no ``lipschitz_upper_bound()`` (as a head that the
    margin certificate counts as 1)."""

    lip_promises = (ONE_LIPSCHITZ,)

    def __init__(self, num_classes: int, scale: float) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.scale = nn.Parameter(torch.tensor(scale))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y[:, : self.num_classes] * self.scale


@pytest.mark.parametrize("scale", [1.25, 0.5])
def test_a_promised_head_is_measured_at_the_features_it_receives(scale):
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, pool="projection").eval()
    model.refresh_power_iteration(5)
    model.head = ScaledHead(3, scale)
    x = torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with capture_inputs(model) as inputs, torch.no_grad():
        model(x)
    assert torch.equal(inputs["head"], model.features(x).detach())
    for kwargs in ({"inputs": inputs}, {"data": x}):  # recorded, or pushed through the body
        if scale > 1:
            with pytest.raises(BrokenPromiseError, match=r"measured 1\.25\b.*at layer 'head'"):
                verify_promises(model, **kwargs)
        else:
            check = verify_promises(model, **kwargs)
            row = next(row for row in check.layers if row.layer == "head")
            assert row.type == "ScaledHead" and 0.49 < row.max_ratio <= 0.5 + 1e-9

