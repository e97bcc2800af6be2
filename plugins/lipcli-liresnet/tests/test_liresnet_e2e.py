"""End to end through real ``lip`` subprocesses with lipcli-liresnet and lipcli-logit-annealing
pip-installed beside (not into) the environment: a LiResNet trains on ``digits`` with
``--loss emma`` (and one with ``--loss la`` and the CRC-Lip ``mlp`` head builds), ``lip certify
--attack`` finds no attack below a certified radius, the model file records the
distributions, and loading it without them names what to install."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lipcli.testing import install_distributions, read_model_metadata, run_lip

#: this distribution's source tree and its sibling's (plugins/lipcli-logit-annealing)
SOURCES = [Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2] / "lipcli-logit-annealing"]
TRAIN = ["train", "--dataset", "digits", "--conv", "soc-fast", "--epochs", "1", "--batch-size", "32",
         "--limit-train", "96", "--limit-test", "16", "--no-lipschitz-estimate", "-q"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return install_distributions(SOURCES, tmp_path_factory.mktemp("liresnet-site"),
                                 tmp_path_factory.mktemp("liresnet-src"))


@pytest.mark.slow
def test_train_emma_certify_attack_and_missing(site, tmp_path):
    def lip(args, site, extra_env=None):
        return run_lip(args, subprocess=True, site=site, env=extra_env)

    listed = lip(["plugins", "--json"], site=site)
    assert listed.exit_code == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)["plugins"]}
    assert plugins["liresnet"]["components"] == {"arch": ["liresnet"], "loss": ["emma"], "recipe": ["liresnet"],
                                                  "importer": ["liresnet"]}
    assert plugins["logit-annealing"]["components"] == {"loss": ["la"]}

    model = tmp_path / "liresnet.safetensors"
    trained = lip([*TRAIN, "--arch", "liresnet:depth=2,width=4,dense=1", "--loss", "emma:eps=0.2",
                   "--out", str(model)], site=site)
    assert trained.exit_code == 0, trained.stderr
    config = read_model_metadata(model)["config"]
    assert config["arch"]["distribution"] == "lipcli-liresnet"
    assert config["arch"]["params"]["depth"] == 2

    cert = lip(["certify", str(model), "--radii", "1,4", "--limit", "16", "--attack",
                "--json", "--no-write", "-q"], site=site)
    assert cert.exit_code == 0, cert.stderr
    summary = json.loads(cert.stdout)
    assert summary["sound"] is True and summary["lipschitz"]["upper_bound"] > 1.0
    assert summary["attack"] is not None and summary["violations"] == 0  # no attack beats a certificate

    la = lip([*TRAIN, "--arch", "liresnet:depth=1,width=4,dense=1", "--loss", "la:gamma=2",
              "--out", str(tmp_path / "la.safetensors")], site=site)
    assert la.exit_code == 0, la.stderr
    mlp = lip([*TRAIN, "--arch", "liresnet:depth=1,width=4,dense=1", "--head", "mlp",
               "--out", str(tmp_path / "mlp.safetensors")], site=site)
    assert mlp.exit_code == 0, mlp.stderr

    missing = lip(["certify", str(model), "--limit", "4", "--no-write"], site=None,
                  extra_env={"LIPCLI_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert missing.exit_code == 1 and "Traceback" not in missing.stderr
    assert "lipcli-liresnet" in missing.stderr
