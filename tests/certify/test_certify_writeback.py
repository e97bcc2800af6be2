"""Write-back of results into the model file (issue 26 item 3): under the file's lock, merged
into what the file holds at the end, refused when the file's weights changed during the run;
every stored result carries its weights' SHA-256 and ``lip info`` says whether it matches."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import lipcli.certify.driver as driver
from lipcli.cli import app
from lipcli.lipschitz.bound import weights_fingerprint
from lipcli.host.modelfile import read_metadata, read_model_file, tensors_fingerprint, update_metadata
from lipcli.host.models import load_model

from conftest import save_tiny_model

DIGITS = {"name": "digits", "params": {}, "num_classes": 10}
runner = CliRunner()


def _certify(path: Path, *extra: str):
    return runner.invoke(app, ["certify", str(path), "--radii", "36", "--limit", "8", "-q",
                               "--device", "cpu", *extra])


def _during_certification(monkeypatch, action) -> None:
    """Run ``action()`` after the features and certificate, before the write-back."""
    original = driver.lipschitz_constant

    def wrapped(*args, **kwargs):
        value = original(*args, **kwargs)
        action()
        return value

    monkeypatch.setattr(driver, "lipschitz_constant", wrapped)


def test_fingerprint_of_the_model_is_that_of_its_file(tmp_path):
    path = save_tiny_model(tmp_path / "m.safetensors", dataset=DIGITS)
    model, mf = load_model(path)
    assert weights_fingerprint(model) == tensors_fingerprint(read_model_file(path).tensors)
    other = save_tiny_model(tmp_path / "o.safetensors", dataset=DIGITS, seed=1)
    assert tensors_fingerprint(read_model_file(other).tensors) != weights_fingerprint(model)


def test_a_file_replaced_during_certification_is_not_written(tmp_path, monkeypatch):
    """``mv B A`` while A is certified: B's weights must not get A's results."""
    a = save_tiny_model(tmp_path / "a.safetensors", dataset=DIGITS, seed=0)
    b = save_tiny_model(tmp_path / "b.safetensors", dataset=DIGITS, seed=1)
    _during_certification(monkeypatch, lambda: os.replace(b, a))
    res = _certify(a)
    assert res.exit_code == 1, res.output
    line = res.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("error: model file ")
    assert "changed during certification" in line and "results not written" in line
    assert read_metadata(a)["results"] is None  # B's file, untouched


def test_a_write_meanwhile_is_merged_not_lost(tmp_path, monkeypatch):
    """Another write-back during the run (a results entry, a cache entry, the lipschitz slot)
    survives this run's write."""
    a = save_tiny_model(tmp_path / "a.safetensors", dataset=DIGITS)

    def other_writer():
        update_metadata(a, {"results": {"other": {"value": 1}}, "cache": {"someone": {"x": 1}},
                            "lipschitz": {"marker": True}})

    _during_certification(monkeypatch, other_writer)
    res = _certify(a)
    assert res.exit_code == 0, res.output
    meta = read_metadata(a)
    assert meta["results"]["other"] == {"value": 1}
    assert meta["cache"]["someone"] == {"x": 1} and meta["lipschitz"] == {"marker": True}
    assert meta["results"]["certify"]["weights_sha256"] == tensors_fingerprint(read_model_file(a).tensors)


def test_concurrent_certifies_and_lipschitz_write_all_survive(tmp_path):
    """Three ``lip certify`` and one ``lip lipschitz --write`` of one file at once (real
    processes): every one succeeds, the file is valid and holds the lipschitz record and a
    complete certify record, both for its weights."""
    a = save_tiny_model(tmp_path / "a.safetensors", dataset=DIGITS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "lipcli"]
    procs = [subprocess.Popen([*base, "certify", str(a), "--radii", "36", "--limit", str(n), "-q",
                               "--device", "cpu", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for n in (6, 7, 8)]
    procs.append(subprocess.Popen([*base, "lipschitz", str(a), "--write", "--no-estimate", "-q",
                                   "--device", "cpu"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    totals = {json.loads(out)["total"] for out, _ in outs[:3]}
    meta = read_metadata(a)
    weights = tensors_fingerprint(read_model_file(a).tensors)
    assert meta["results"]["certify"]["total"] in totals
    runs = meta["results"]["certify_runs"]  # every distinct certification is kept
    assert sorted(r["total"] for r in runs) == [6, 7, 8] == sorted(totals)
    assert meta["results"]["certify"] == runs[-1]
    assert meta["results"]["certify"]["weights_sha256"] == weights
    assert meta["lipschitz"]["weights_sha256"] == weights


def test_the_same_evaluation_replaces_its_record_and_info_lists_the_others(tmp_path):
    a = save_tiny_model(tmp_path / "a.safetensors", dataset=DIGITS)
    for limit in ("6", "8", "6"):
        assert runner.invoke(app, ["certify", str(a), "--radii", "36", "--limit", limit, "-q"]).exit_code == 0
    results = read_metadata(a)["results"]
    assert [r["total"] for r in results["certify_runs"]] == [8, 6] and results["certify"]["total"] == 6
    card = json.loads(runner.invoke(app, ["info", str(a), "--json"]).stdout)
    assert [r["total"] for r in card["results"]["certify_runs"]] == [8, 6]
    text = runner.invoke(app, ["info", str(a)]).stdout
    assert "(6 points)" in text and "  also stored: lip certify" in text and "(8 points)" in text


def test_info_says_whether_stored_results_match_the_weights(tmp_path):
    a = save_tiny_model(tmp_path / "a.safetensors", dataset=DIGITS, seed=0)
    assert _certify(a).exit_code == 0
    assert runner.invoke(app, ["lipschitz", str(a), "--write", "--no-estimate", "-q"]).exit_code == 0
    b = tmp_path / "b.safetensors"
    shutil.copy(save_tiny_model(tmp_path / "b0.safetensors", dataset=DIGITS, seed=1), b)
    meta = read_metadata(a)
    update_metadata(b, {"results": meta["results"], "lipschitz": meta["lipschitz"]})  # stale copy

    card = json.loads(runner.invoke(app, ["info", str(a), "--json"]).stdout)
    assert card["weights_sha256"] == tensors_fingerprint(read_model_file(a).tensors)
    assert card["results"]["certify"]["weights_match"] is True
    assert card["lipschitz"]["weights_match"] is True
    card = json.loads(runner.invoke(app, ["info", str(b), "--json"]).stdout)
    assert card["results"]["certify"]["weights_match"] is False
    assert card["lipschitz"]["weights_match"] is False
    text = runner.invoke(app, ["info", str(b)]).stdout
    assert text.count("for OTHER weights") == 2
    assert runner.invoke(app, ["info", str(a)]).stdout.count("for these weights") == 2


def test_training_results_carry_the_weights_fingerprint(tiny_model_file):
    res = read_metadata(tiny_model_file)["results"]
    assert res["weights_sha256"] == tensors_fingerprint(read_model_file(tiny_model_file).tensors)
    card = json.loads(runner.invoke(app, ["info", str(tiny_model_file), "--json"]).stdout)
    assert card["results"]["weights_match"] is True
