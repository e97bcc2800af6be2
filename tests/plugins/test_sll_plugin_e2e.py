"""End to end with plugins/lipcli-sll pip-installed beside (not into) the environment: the
``sll`` entry point is discovered, ``lip train --arch lipconvnet-5 --conv sll`` (with inline
parameters) trains, ``lip lipschitz`` reports every SLL layer's guaranteed bound and
``lip certify`` certifies, all through real ``lip`` subprocesses; the model file records the
distribution and loading it without the plugin names what to install."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugin_sites import install_plugins, lip

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return install_plugins(["lipcli-sll"], tmp_path_factory.mktemp("sll-site"),
                           tmp_path_factory.mktemp("sll-src"))


def test_train_lipschitz_certify_and_missing(site, tmp_path):
    listed = lip(["plugins", "--json"], site=site)
    assert listed.exit_code == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)["plugins"]}
    assert plugins["sll"]["distribution"] == "lipcli-sll" and plugins["sll"]["error"] is None
    assert plugins["sll"]["components"] == {
        "conv": ["sll"], "arch": ["sll-small", "sll-medium", "sll-large", "sll-xlarge"],
        "recipe": ["sll-small"], "importer": ["sll"]}

    model = tmp_path / "sll.safetensors"
    trained = lip(
        ["train", "--dataset", "digits", "--arch", "lipconvnet-5", "--conv", "sll:inner_factor=2",
         "--width", "4", "--epochs", "1", "--batch-size", "32", "--limit-train", "128",
         "--limit-test", "32", "--no-lipschitz-estimate", "-q", "--out", str(model)],
        site=site,
    )
    assert trained.exit_code == 0, trained.stderr
    from lipcli.host.modelfile import read_metadata

    conv = read_metadata(model)["config"]["conv"]
    assert conv["name"] == "sll" and conv["distribution"] == "lipcli-sll"
    assert conv["params"]["inner_factor"] == 2

    report = lip(["lipschitz", str(model), "--json", "--no-estimate"], site=site)
    assert report.exit_code == 0, report.stderr
    rows = [r for r in json.loads(report.stdout)["layers"] if "conv" in r["name"] or "down" in r["name"]]
    assert len(rows) == 6 and all(r["source"] == "bound" for r in rows)
    assert all(1.0 <= r["upper_bound"] < 1.0 + 1e-4 for r in rows)

    cert = lip(["certify", str(model), "--radii", "36,72", "--limit", "16", "--json", "--no-write",
                "-q", "--attack", "--attack-steps", "10", "--attack-restarts", "1"], site=site)
    assert cert.exit_code == 0, cert.stderr
    summary = json.loads(cert.stdout)
    assert summary["sound"] is True and summary["total"] == 16

    if installed_in_environment("lipcli-sll"):  # .ci/run installs it: nothing can be missing
        return
    missing = lip(["certify", str(model), "--limit", "4", "--no-write"], site=None)
    assert missing.exit_code == 1 and "Traceback" not in missing.stderr
    line = missing.stderr.strip()
    assert "\n" not in line and "pip install lipcli-sll" in line, line


def installed_in_environment(dist: str) -> bool:
    import importlib.metadata as md

    try:
        md.distribution(dist)
    except md.PackageNotFoundError:
        return False
    return True
