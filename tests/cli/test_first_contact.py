"""Red-team findings of issue 26 item 9, each through the real CLI: a model at a non-UTF-8
path, ``--config DIR``, one exit code for a missing model file, duplicate inline keys,
symlinked run directories, ``lip export`` never writing a ``.safetensors`` name, and upper
limits of ``--epochs``, ``--nproc-per-node`` and ``polygon:radius``."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.host import plugins
from lipcli.testing import registered

from conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
DIGITS = {"name": "digits", "params": {}, "num_classes": 10}
runner = CliRunner()


def _one_line(r, code: int) -> str:
    assert r.exit_code == code, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def _lip(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "lipcli", *args], capture_output=True, env=env,
                          cwd=cwd, timeout=300)


def test_a_model_at_a_non_utf8_path_is_read(tmp_path):
    path = os.path.join(os.fsencode(tmp_path), b"caf\xe9.safetensors")
    try:
        save_tiny_model(Path(os.fsdecode(path)), dataset=DIGITS)
    except OSError:  # a file system that only takes UTF-8 names
        pytest.skip("file system refuses non-UTF-8 names")
    # in-process: the argument as a real process's sys.argv holds it (surrogate escapes)
    info = runner.invoke(app, ["info", os.fsdecode(path), "--json"])
    assert info.exit_code == 0, info.output
    assert json.loads(info.stdout)["num_classes"] == 10
    cert = _lip("certify", path, "--limit", "4", "--radii", "36", "-q", cwd=tmp_path)
    assert cert.returncode == 0, cert.stderr
    assert b"truncated or corrupt" not in cert.stderr


def test_config_naming_a_directory_says_so(tmp_path):
    line = _one_line(runner.invoke(app, ["train", "--dataset", "digits", "--config", str(tmp_path)]), 2)
    assert line == f"error: config file {tmp_path} is a directory; give a .toml, .json or .yaml file"


@pytest.mark.parametrize("command", [["info"], ["certify"], ["lipschitz"], ["export"], ["bench", "certify"]])
def test_a_missing_model_file_is_a_usage_error_in_every_command(tmp_path, command):
    missing = tmp_path / "missing.safetensors"
    line = _one_line(runner.invoke(app, [*command, str(missing)]), 2)
    assert line == f"error: model file not found: {missing}"


def test_duplicate_inline_parameters_are_refused(tmp_path):
    r = runner.invoke(app, ["train", "--dataset", "digits", "--conv", "soc-fast:train_terms=4,train_terms=8",
                            "--out", str(tmp_path / "m.safetensors")])
    assert _one_line(r, 2) == ("error: parameter 'train_terms' given twice in "
                               "'soc-fast:train_terms=4,train_terms=8'")
    assert not (tmp_path / "m.safetensors").exists()


def test_model_less_commands_find_models_in_symlinked_run_directories(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    elsewhere = tmp_path / "disk" / "run-7"
    elsewhere.mkdir(parents=True)
    save_tiny_model(elsewhere / "model.safetensors", dataset=DIGITS)
    (runs / "run-7").symlink_to(elsewhere, target_is_directory=True)
    (runs / "loop").symlink_to(runs, target_is_directory=True)  # a loop is walked once
    r = _lip("info", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.decode().strip() == f"using the most recent model {Path('runs') / 'run-7' / 'model.safetensors'}"


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
def test_export_never_writes_a_safetensors_name(tmp_path, extra):
    model = save_tiny_model(tmp_path / "m.safetensors", dataset=DIGITS)
    other = save_tiny_model(tmp_path / "other.safetensors", dataset=DIGITS, seed=1)
    before = other.read_bytes()
    line = _one_line(runner.invoke(app, ["export", str(model), "-o", str(other), *extra]), 2)
    assert "has the model files' suffix .safetensors" in line and "--output" in line
    assert other.read_bytes() == before


def test_epochs_and_processes_have_upper_limits(tmp_path):
    out = ["--dataset", "digits", "--out", str(tmp_path / "m.safetensors")]
    line = _one_line(runner.invoke(app, ["train", *out, "--epochs", "100001"]), 2)
    assert line == "error: --epochs must be in 1..100000, got 100001"
    r = _lip("train", *out, "--nproc-per-node", "100000", cwd=tmp_path)
    assert r.returncode == 2
    err = r.stderr.decode().strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and "--nproc-per-node" in err and "256" in err
    assert not (tmp_path / "m.safetensors").exists()


def test_polygon_radius_has_an_upper_limit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = str(ROOT / "plugins" / "lipcli-polygon-pool" / "src")
    sys.path.insert(0, src)
    try:
        module = importlib.import_module("lipcli_polygon_pool.plugin")
    finally:
        sys.path.remove(src)
    plugins.reset()
    try:
        with registered(("polygon-in-process", module)):  # unless installed
            r = runner.invoke(app, ["train", "--dataset", "digits", "--width", "4", "--pool", "polygon:radius=1e30",
                                    "--out", "x/m.safetensors"])
        line = _one_line(r, 2)
        assert line.startswith("error: pool 'polygon' rejected radius=1e30: radius must be in (0.01, 10000]"), line
    finally:
        plugins.reset()
