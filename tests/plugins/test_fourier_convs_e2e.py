"""End to end with the convolution distributions plugins/lipcli-bro and plugins/lipcli-lot,
pip-installed beside (not into) the environment: both entry points are discovered by
``lip plugins``, ``lip train --conv bro:rank_ratio=0.25`` / ``--conv lot:iterations=5`` on
digits and ``lip certify`` run as real ``lip`` subprocesses, the model files record the
distribution and the parameters, ``lip lipschitz`` reports the layers' guaranteed bounds,
and loading without the plugin names what to install."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugin_sites import install_plugins, lip

DISTS = {"bro": "lipcli-bro", "lot": "lipcli-lot"}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return install_plugins(
        list(DISTS.values()), tmp_path_factory.mktemp("fourier-site"), tmp_path_factory.mktemp("fourier-src")
    )


def test_entry_points_are_discovered(site):
    listed = lip(["plugins", "--json"], site=site)
    assert listed.exit_code == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)["plugins"]}
    for name, dist in DISTS.items():
        assert plugins[name]["distribution"] == dist and plugins[name]["error"] is None
        assert plugins[name]["components"]["conv"] == [name]
    assert sorted(plugins["bro"]["components"]["importer"]) == ["bronet", "bronet-lipconvnet"]


@pytest.mark.parametrize("conv, params", [("bro", {"rank_ratio": 0.25}), ("lot", {"iterations": 5})])
def test_train_certify_and_missing(site, tmp_path, conv, params):
    model = tmp_path / f"{conv}.safetensors"
    inline = conv + ":" + ",".join(f"{k}={v}" for k, v in params.items())
    trained = lip(
        ["train", "--dataset", "digits", "--arch", "lipconvnet-5", "--width", "4", "--conv", inline,
         "--epochs", "1", "--batch-size", "32", "--limit-train", "96", "--limit-test", "16",
         "--no-lipschitz-estimate", "-q", "--out", str(model)],
        site=site,
    )
    assert trained.exit_code == 0, trained.stderr
    from lipcli.host.modelfile import read_metadata

    config = read_metadata(model)["config"]
    assert config["conv"]["distribution"] == DISTS[conv]
    assert config["conv"]["params"] == {**{"bro": {"rank": 0, "rank_ratio": 0.5, "init": "identity", "factor": "auto",
                                                   "rank_rule": "ratio", "border": "circular", "ridge": 0.0},
                                           "lot": {"iterations": 10, "eps": 1e-4, "init": "identity",
                                                   "border": "circular"}}[conv],
                                        **params}

    cert = lip(["certify", str(model), "--radii", "36,72", "--limit", "16", "--json",
                "--no-write", "-q"], site=site)
    assert cert.exit_code == 0, cert.stderr
    summary = json.loads(cert.stdout)
    assert summary["sound"] is True and summary["total"] == 16

    bound = lip(["lipschitz", str(model), "--json", "--no-estimate"], site=site)
    assert bound.exit_code == 0, bound.stderr
    rows = [r for r in json.loads(bound.stdout)["layers"] if "conv" in r["name"] or "down" in r["name"]]
    assert len(rows) == 6 and all(r["source"] == "bound" and r["upper_bound"] < 1 + 1e-4 for r in rows)

    # no plugin discovery at all (the distributions may also be installed in this environment)
    missing = lip(["certify", str(model), "--limit", "4", "--no-write"], site=None,
                  extra_env={"LIPCLI_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert missing.exit_code == 1 and "Traceback" not in missing.stderr
    line = missing.stderr.strip()
    assert "\n" not in line and DISTS[conv] in line, line  # "pip install ..." or "not loaded"
