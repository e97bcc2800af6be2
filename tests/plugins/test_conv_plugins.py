"""The convolution plugin distributions (plugins/lipcli-aol, -cayley, -bcop, -sll, -bro, -lot) through lipcli:
``lip train --conv NAME`` in every LipConvnet depth, certification with their bounds, model
files that record the providing distribution, and the message when it is missing.

The plugins are registered in-process (their source trees are on the test path); their
entry points are checked by each plugin's own tests when the distribution is installed
(``.ci/run`` installs them).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json

import pytest
import torch
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.sdk.errors import MissingPluginError
from lipcli.lipschitz.bound import guaranteed_upper_bound
from lipcli.host.models import create_model, load_model, save_model
from lipcli.host.modelfile import read_metadata
from lipcli.host.plugins import create_host, get_registry, register_plugin, unregister_plugin
from lipcli.testing import check_conv_network_bound

#: conv name -> (distribution, plugin module)
CONV_PLUGINS = {
    "aol": ("lipcli-aol", "lipcli_aol.plugin"),
    "bcop": ("lipcli-bcop", "lipcli_bcop.plugin"),
    "cayley": ("lipcli-cayley", "lipcli_cayley.plugin"),
    "sll": ("lipcli-sll", "lipcli_sll.plugin"),
    "bro": ("lipcli-bro", "lipcli_bro.plugin"),
    "lot": ("lipcli-lot", "lipcli_lot.plugin"),
}

runner = CliRunner()
TINY = ["--dataset", "digits", "--width", "2", "--batch-size", "32", "--limit-train", "64",
        "--limit-test", "32", "--epochs", "1", "--no-lipschitz-estimate", "-q"]


def _host(name: str):
    dist, module = CONV_PLUGINS[name]
    host = create_host(autoload=False)
    host.register(importlib.import_module(module), name, distribution=dist, version="0.1.0")
    return host


@pytest.fixture
def in_process(request):
    name = request.param
    if name in get_registry().names("conv"):  # the distribution is installed
        yield name
        return
    register_plugin(importlib.import_module(CONV_PLUGINS[name][1]), f"test-{name}")
    yield name
    unregister_plugin(f"test-{name}")


@pytest.mark.parametrize("name", sorted(CONV_PLUGINS))
@pytest.mark.parametrize("depth", [5, 10, 40])  # 1, 2 and 8 convolutions per block
def test_every_depth_builds_runs_and_is_bounded(name, depth):
    reg = _host(name).registry()
    torch.manual_seed(0)
    model = create_model(f"lipconvnet-{depth}", conv=name, width=2, num_classes=10, registry=reg)
    model.eval()
    with torch.no_grad():
        logits = model(torch.rand(2, 3, 32, 32))
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    bound, rows = guaranteed_upper_bound(model)
    convs = [r for r in rows if "conv" in r.name or "down" in r.name]
    assert len(convs) == depth + 1 and all(r.source == "bound" for r in convs)
    assert all(r.upper_bound <= 1 + 1e-4 for r in convs)
    assert bound < 5.0  # 1/min(std) of the digits normalisation times ~1 per layer


@pytest.mark.parametrize("name", sorted(CONV_PLUGINS))
def test_network_bound_covers_the_dense_jacobian(name):
    """A tiny LipConvnet: guaranteed bound >= the feature map's Jacobian norm at a random input."""
    bound, norm = check_conv_network_bound(name, registry=_host(name).registry(), width=2, points=1)
    assert 0 < norm <= bound


@pytest.mark.parametrize("name", sorted(CONV_PLUGINS))
def test_entry_point_when_installed(name):
    dist_name, module = CONV_PLUGINS[name]
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        pytest.skip(f"{dist_name} is not installed (.ci/run installs it)")
    eps = [ep for ep in dist.entry_points if ep.group == "lipcli"]
    assert [(ep.name, ep.value) for ep in eps] == [(name, module)]
    assert [s.name for s in eps[0].load().lip_convolutions()] == [name]


@pytest.mark.parametrize("name", sorted(CONV_PLUGINS))
def test_model_file_records_the_distribution_and_names_it_when_missing(name, tmp_path):
    dist = CONV_PLUGINS[name][0]
    reg = _host(name).registry()
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", conv=name, width=4, num_classes=10, registry=reg)
    model.eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        logits = model(x)
    path = save_model(model, tmp_path / "m.safetensors")
    conv = read_metadata(path)["config"]["conv"]
    assert conv["name"] == name and conv["distribution"] == dist
    loaded, _ = load_model(path, registry=reg)
    with torch.no_grad():
        assert torch.equal(loaded(x), logits)
    assert loaded.lipschitz_upper_bound() == model.lipschitz_upper_bound()
    with pytest.raises(MissingPluginError, match=f"conv '{name}' from distribution '{dist}'"):
        load_model(path, registry=create_host(autoload=False).registry())


@pytest.mark.parametrize("in_process", sorted(CONV_PLUGINS), indirect=True)
def test_lip_train_and_certify_with_the_conv(in_process, tmp_path):
    name = in_process
    out = tmp_path / "model.safetensors"
    r = runner.invoke(app, ["train", *TINY, "--conv", name, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert read_metadata(out)["config"]["conv"]["name"] == name
    r = runner.invoke(app, ["certify", str(out), "--radii", "36,72", "--limit", "8", "--json",
                            "--no-write", "-q", "--attack", "--attack-steps", "10",
                            "--attack-restarts", "1"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["sound"] is True and summary["total"] == 8
    r = runner.invoke(app, ["lipschitz", str(out), "--json", "--no-estimate"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    conv_rows = [row for row in report["layers"] if "conv" in row["name"] or "down" in row["name"]]
    assert len(conv_rows) == 6 and all(row["source"] == "bound" for row in conv_rows)
    assert all(row["upper_bound"] < 1.0 + 1e-4 for row in conv_rows)
