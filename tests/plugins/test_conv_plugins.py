"""Every convolution an installed plugin distribution provides (tests/plugin_tables.py: the
table derives from the ``lipcli`` entry points; ``.ci/run`` installs every ``plugins/*/``)
through lipcli: the spec's conformance checks, ``lip train --conv NAME`` in every LipConvnet
depth, certification with its bound, the network bound against the dense Jacobian, model files
that record the providing distribution, and the message when it is missing."""

from __future__ import annotations

import importlib.metadata as md
import json

import pytest
import torch

from lipcli.sdk.errors import MissingPluginError
from lipcli.testing import (
    check_conv_network_bound,
    check_conv_spec,
    create_model,
    guaranteed_upper_bound,
    load_model,
    plugin_registry,
    read_model_metadata,
    registered,
    run_lip,
    save_model,
)
from plugin_tables import CONVS

NAMES = sorted(CONVS)
TINY = ["--dataset", "digits", "--width", "2", "--batch-size", "32", "--limit-train", "64",
        "--limit-test", "32", "--epochs", "1", "--no-lipschitz-estimate", "-q"]


def _registry():
    """The built-ins and the installed distributions (a fresh host: hermetic)."""
    return plugin_registry(autoload=True)


def test_the_table_has_the_installed_convolutions():
    """The table is what the entry points provide, each from a distribution that is installed
    (an empty table would make every test below vacuous)."""
    assert NAMES, "no convolution plugin is installed (.ci/run installs plugins/*/)"
    for name, component in CONVS.items():
        assert md.distribution(component.distribution).name == component.distribution
        assert name in [s.name for s in component.module.lip_convolutions()]


@pytest.mark.parametrize("name", NAMES)
def test_spec_conforms(name):
    reports = check_conv_spec(CONVS[name].spec)
    assert reports and all(r.sigma_max <= r.bound * (1 + 1e-6) for r in reports)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("depth", [5, 10, 40])  # 1, 2 and 8 convolutions per block
def test_every_depth_builds_runs_and_is_bounded(name, depth):
    torch.manual_seed(0)
    model = create_model(f"lipconvnet-{depth}", conv=name, width=2, num_classes=10, registry=_registry())
    model.eval()
    with torch.no_grad():
        logits = model(torch.rand(2, 3, 32, 32))
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    bound, rows = guaranteed_upper_bound(model)
    convs = [r for r in rows if "conv" in r.name or "down" in r.name]
    assert len(convs) == depth + 1 and all(r.source == "bound" for r in convs)
    assert all(r.upper_bound <= 1 + 1e-4 for r in convs)
    assert bound < 5.0  # 1/min(std) of the digits normalisation times ~1 per layer


@pytest.mark.parametrize("name", NAMES)
def test_network_bound_covers_the_dense_jacobian(name):
    """A tiny LipConvnet: guaranteed bound >= the feature map's Jacobian norm at a random input."""
    bound, norm = check_conv_network_bound(name, registry=_registry(), width=2, points=1)
    assert 0 < norm <= bound


@pytest.mark.parametrize("name", NAMES)
def test_entry_point_names_the_plugin_module(name):
    """The distribution's ``lipcli`` entry point is the plugin module that provides the conv."""
    component = CONVS[name]
    eps = [ep for ep in md.distribution(component.distribution).entry_points if ep.group == "lipcli"]
    assert [ep.name for ep in eps] == [component.plugin]
    assert eps[0].load() is component.module


@pytest.mark.parametrize("name", NAMES)
def test_model_file_records_the_distribution_and_names_it_when_missing(name, tmp_path):
    dist = CONVS[name].distribution
    reg = _registry()
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", conv=name, width=4, num_classes=10, registry=reg)
    model.eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        logits = model(x)
    path = save_model(model, tmp_path / "m.safetensors")
    conv = read_model_metadata(path)["config"]["conv"]
    assert conv["name"] == name and conv["distribution"] == dist
    loaded, _ = load_model(path, registry=reg)
    with torch.no_grad():
        assert torch.equal(loaded(x), logits)
    assert loaded.lipschitz_upper_bound() == model.lipschitz_upper_bound()
    with pytest.raises(MissingPluginError, match=f"conv '{name}' from distribution '{dist}'"):
        load_model(path, registry=plugin_registry())


@pytest.mark.parametrize("name", NAMES)
def test_lip_train_and_certify_with_the_conv(name, tmp_path):
    out = tmp_path / "model.safetensors"
    with registered((CONVS[name].plugin, CONVS[name].module)):
        r = run_lip(["train", *TINY, "--conv", name, "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert read_model_metadata(out)["config"]["conv"]["name"] == name
        r = run_lip(["certify", str(out), "--radii", "36,72", "--limit", "8", "--json", "--no-write", "-q",
                     "--attack", "--attack-steps", "10", "--attack-restarts", "1"])
        assert r.exit_code == 0, r.output
        summary = r.json()
        assert summary["sound"] is True and summary["total"] == 8
        r = run_lip(["lipschitz", str(out), "--json", "--no-estimate"])
        assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    conv_rows = [row for row in report["layers"] if "conv" in row["name"] or "down" in row["name"]]
    assert len(conv_rows) == 6 and all(row["source"] == "bound" for row in conv_rows)
    assert all(row["upper_bound"] < 1.0 + 1e-4 for row in conv_rows)
