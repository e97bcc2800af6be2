"""``lip train --recipe lipnext`` end to end on digits (tiny): it trains with so-adam and
certifies; every declared matrix is orthogonal to the retraction tolerance after training; a
run killed mid-epoch resumes bit-identically; ``lip certify --attack`` finds no violation and
``lip export --certify`` runs."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lipcli.sdk.orthogonal import orthogonal_parameters, orthogonality_defect
from lipcli.testing import load_model, read_model_metadata, run_lip

TINY = ["train", "--recipe", "lipnext", "--dataset", "digits", "--arch", "lipnext:depth=2,width=16",
        "--batch-size", "32", "--limit-train", "96", "--limit-test", "32", "--epochs", "2",
        "--warmup-epochs", "0.5", "--device", "cpu", "--no-lipschitz-estimate", "-q"]
INTERRUPT_ENV = "LIPCLI_TRAIN_INTERRUPT_AT"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("lipnext")
    r = run_lip([*TINY, "--out", str(d / "a.safetensors"), "--run-dir", str(d / "a-run")])
    assert r.exit_code == 0, r.output
    return d


def test_trains_with_so_adam_and_stays_orthogonal(trained):
    path = trained / "a.safetensors"
    meta = read_model_metadata(path)
    opt = meta["training"]["optimization"]
    assert opt["name"] == "so-adam" and opt["class"] == "SOAdam"
    assert opt["params"]["euclidean"] == "nadam" and opt["lookahead"] == {"k": 6, "alpha": 0.5}
    assert opt["orthogonal_parameters"] == ["body.stem.weight", "body.block1.R", "body.block1.M",
                                            "body.block2.R", "body.block2.M"]
    assert sum(opt["fastexp_orders"].values()) > 0
    model, _ = load_model(path)
    tol = opt["params"]["retract_tol"]
    for p in orthogonal_parameters(model):
        assert orthogonality_defect(p.param) <= tol, p.name
    bound = meta["lipschitz"]["upper_bound"]
    assert bound >= 1 / 0.3237 * 0.999 and bound < 1 / 0.3237 * (1 + 1e-3)


def test_resume_after_a_kill_is_bit_identical(trained):
    out = trained / "b.safetensors"
    r = run_lip([*TINY, "--out", str(out), "--run-dir", str(trained / "b-run")], env={INTERRUPT_ENV: "1:1"})
    assert r.exit_code == 130, r.output
    r = run_lip(["train", "--resume", str(trained / "b-run"), "-q"])
    assert r.exit_code == 0, r.output
    a, b = load_file(str(trained / "a.safetensors")), load_file(str(out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_certify_attack_and_export(trained):
    path = trained / "a.safetensors"
    cert = run_lip(["certify", str(path), "--limit", "32", "--attack", "--json", "--no-write", "-q"])
    assert cert.exit_code == 0, cert.output
    summary = json.loads(cert.stdout)
    assert summary["sound"] is True and summary["violations"] == 0
    exp = run_lip(["export", str(path), "--format", "pt2", "--output", str(trained / "a.pt2"), "--check", "8",
                   "--certify", "--json", "-q"])
    assert exp.exit_code == 0, exp.output
    report = json.loads(exp.stdout)
    assert report["check"]["prediction_mismatches"] == 0
    assert report["record"]["lipschitz"]["upper_bound"] >= summary["lipschitz"]["upper_bound"]


def test_so_adam_on_a_model_without_orthogonal_parameters_is_one_line(tmp_path):
    r = run_lip(["train", "--dataset", "digits", "--width", "4", "--optimizer", "so-adam", "--epochs", "1",
                 "--limit-train", "16", "--limit-test", "16", "--device", "cpu", "-q",
                 "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 2, r.output
    assert "declares none" in r.stderr and "Traceback" not in r.stderr
