"""The commands as typed: no MODEL -> the newest model file under ./runs or $LIPCLI_RUNS
(named on stderr); nothing there -> one line naming the directory; lip train's default data
set explains what it needs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.host.runs import RUNS_ENV, latest_model

from conftest import save_tiny_model

runner = CliRunner()


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for sub in ("a", "b/nested"):
        (root / sub).mkdir(parents=True)
    old = save_tiny_model(root / "a" / "model.safetensors", dataset=None, seed=0)
    new = save_tiny_model(root / "b" / "nested" / "other.safetensors", dataset=None, seed=1)
    decoy = root / "c" / "checkpoint.safetensors"  # newest, but a checkpoint: not a model
    decoy.parent.mkdir(parents=True)
    decoy.write_bytes(new.read_bytes())
    foreign = root / "d" / "weights.safetensors"  # not a lipcli file
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    for i, p in enumerate((old, new, decoy, foreign)):
        os.utime(p, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))
    return root


def test_latest_model_is_the_newest_lipcli_model_file(runs):
    assert latest_model(runs) == runs / "b" / "nested" / "other.safetensors"


@pytest.mark.parametrize("command", [["info", "--json"], ["lipschitz", "--no-estimate", "-q", "--json"]])
def test_commands_without_model_use_the_newest_and_say_so(runs, command):
    r = runner.invoke(app, command, env={RUNS_ENV: str(runs)})
    assert r.exit_code == 0, r.output
    chosen = runs / "b" / "nested" / "other.safetensors"
    assert r.stderr.strip() == f"using the most recent model {chosen}"
    data = json.loads(r.stdout)
    assert (data.get("file") or data.get("model")) == str(chosen)


@pytest.mark.parametrize("command", [["certify", "--radii", "36,72,108"], ["lipschitz"], ["info"],
                                     ["export", "--format", "onnx"]])
def test_no_model_anywhere_is_one_line_naming_the_directory(tmp_path, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, command, env={RUNS_ENV: ""})
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        f"error: no MODEL given and no runs directory runs (set {RUNS_ENV} to search elsewhere); "
        "pass a model file"]
    (tmp_path / "empty").mkdir()
    r = runner.invoke(app, command, env={RUNS_ENV: str(tmp_path / "empty")})
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        f"error: no MODEL given and no model file (*.safetensors) under {tmp_path / 'empty'}; "
        "pass a model file"]


def test_train_default_dataset_says_what_it_needs(tmp_path, monkeypatch):
    """The command as typed: CIFAR-10 in the default data root, downloaded there; offline (a
    refused local port stands for the network) one line naming the folder and digits."""
    import torchvision

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    monkeypatch.setenv("LIPCLI_DATA", str(tmp_path / "data"))
    r = runner.invoke(app, ["train", "--arch", "lipconvnet-20", "--head", "mlp", "-q"])
    assert r.exit_code == 1
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: could not download cifar10 into {tmp_path / 'data'} (")
    assert "put the folder cifar-10-batches-py" in line and line.endswith("--dataset digits")
    assert not (tmp_path / "runs").exists()
