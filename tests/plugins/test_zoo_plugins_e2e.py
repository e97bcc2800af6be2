"""End to end with the activation/head/certificate distributions plugins/lipcli-householder and
plugins/lipcli-ortho-head, pip-installed beside (not into) the environment: both entry
points are discovered by a real ``lip plugins`` subprocess, a model with ``--activation
householder:order=2 --head ortho`` trains and is certified by ``margin`` (in-process where the
environment has both, see :func:`plugin_sites.lip_using`), the model file records both
distributions, and a real process loading it without them names what to install."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from plugin_sites import install_plugins, lip, lip_using

DISTS = {"householder": "lipcli-householder", "ortho": "lipcli-ortho-head"}
MODULES = ("lipcli_householder", "lipcli_ortho_head")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return install_plugins(
        list(DISTS.values()), tmp_path_factory.mktemp("zoo-site"), tmp_path_factory.mktemp("zoo-src")
    )


def test_entry_points_train_certify_and_missing(site, tmp_path):
    listed = lip(["plugins", "--json"], site=site)
    assert listed.exit_code == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)["plugins"]}
    assert plugins["householder"]["distribution"] == "lipcli-householder"
    assert plugins["householder"]["components"] == {"activation": ["householder"]}
    assert plugins["ortho"]["distribution"] == "lipcli-ortho-head"
    assert plugins["ortho"]["components"] == {"head": ["ortho"], "certificate": ["margin"]}
    assert all(plugins[n]["error"] is None for n in DISTS)

    model = tmp_path / "hh-ortho.safetensors"
    trained = lip_using(
        ["train", "--dataset", "digits", "--arch", "lipconvnet-5", "--width", "4",
         "--activation", "householder:order=2", "--head", "ortho", "--epochs", "1",
         "--batch-size", "32", "--limit-train", "64", "--limit-test", "16",
         "--no-lipschitz-estimate", "-q", "--out", str(model)],
        site=site, modules=MODULES,
    )
    assert trained.exit_code == 0, trained.stderr
    from lipcli.host.modelfile import read_metadata

    config = read_metadata(model)["config"]
    assert config["activation"]["distribution"] == "lipcli-householder"
    assert config["activation"]["params"] == {"order": 2}
    assert config["head"]["distribution"] == "lipcli-ortho-head"

    cert = lip_using(["certify", str(model), "--radii", "36,72", "--limit", "16", "--json",
                      "--no-write", "-q"], site=site, modules=MODULES)
    assert cert.exit_code == 0, cert.stderr
    summary = json.loads(cert.stdout)
    assert summary["certificate"]["name"] == "margin" and summary["sound"] is True
    assert summary["certificate"]["provider"] == "ortho"

    # absent from this environment: named with what to install; installed here (.ci/run) but
    # plugin loading switched off: said so
    installed = importlib.util.find_spec("lipcli_ortho_head") is not None
    env = {"LIPCLI_DISABLE_PLUGIN_AUTOLOAD": "1"} if installed else {}
    missing = lip(["certify", str(model), "--limit", "4", "--no-write"], site=None, extra_env=env)
    assert missing.exit_code == 1 and "Traceback" not in missing.stderr
    line = missing.stderr.strip()
    expected = "installed plugins are not loaded" if installed else "pip install lipcli-"
    assert "\n" not in line and expected in line, line
