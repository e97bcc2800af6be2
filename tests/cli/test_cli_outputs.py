"""CLI manners of ``lip certify`` and ``lip bench`` around outputs and inputs: output paths are
checked before any work, a write that fails at the end still prints the results, class names
recorded in a model file are checked, infinite radii are written as ``inf``, option checks
agree between commands, and ``lip bench profile -q`` is quiet."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.host.modelfile import read_metadata

from conftest import save_tiny_model
from lipcli.host.models import create_model, save_model

ROOT = Path(__file__).resolve().parents[2]
DIGITS = {"name": "digits", "params": {}, "num_classes": 10,
          "classes": [str(i) for i in range(10)]}
FAST = ["--radii", "36", "--limit", "8", "-q"]
BENCH_TINY = ["--width", "4", "--batch-size", "2", "--device", "cpu", "--threads", "1", "-q"]


def _save(path: Path, *, num_classes: int = 10, dataset=DIGITS, head: str = "lln") -> Path:
    return save_tiny_model(path, dataset=dataset, num_classes=num_classes, head=head)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _error(res, code: int) -> str:
    assert res.exit_code == code, (res.exit_code, res.output)
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.output
    return res.stderr


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return _save(tmp_path_factory.mktemp("outputs") / "m.safetensors")


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_work(monkeypatch):
    """Make any certification / benchmark work fail loudly: the checks must come first."""
    import lipcli.bench as bench_mod

    def boom(*_a, **_k):
        raise AssertionError("the work started before the output path was checked")

    # where each command looks it up; the importing module first, so that importing it here
    # cannot bind the replacement for good
    monkeypatch.setattr("lipcli.certify.driver.load_model", boom)  # lip certify
    monkeypatch.setattr("lipcli.host.models.load_model", boom)  # lip lipschitz, lip bench certify
    for name in ("bench_train", "bench_certify", "bench_profile"):
        monkeypatch.setattr(bench_mod, name, boom)


# -- 1. output paths are checked up front --------------------------------------------------------
def test_bad_output_paths_are_usage_errors_before_any_work(model_file: Path, tmp_path: Path, no_work) -> None:
    runner = CliRunner()
    m = str(model_file)
    cases = [
        (["certify", m, "--no-write", "--plot", str(tmp_path / "x.txt")], "'txt' is not supported"),
        (["certify", m, "--no-write", "--plot", str(tmp_path)], "is a directory"),
        (["certify", m, "--no-write", "--per-sample", str(tmp_path)], "is a directory"),
        (["certify", m, "--no-write", "--per-sample", str(tmp_path / "no" / "x.csv")], "does not exist"),
        (["bench", "certify", m, "-o", str(tmp_path / "no" / "x.json"), "-q"], "does not exist"),
        (["bench", "certify", "-o", str(tmp_path), *BENCH_TINY], "is a directory"),
        (["bench", "train", "--archs", "5", "-o", str(tmp_path / "no" / "x.json"), *BENCH_TINY],
         "does not exist"),
        (["bench", "profile", "--arch", "5", "-o", str(tmp_path / "no" / "x.json"), *BENCH_TINY],
         "does not exist"),
    ]
    for args, text in cases:
        err = _error(runner.invoke(app, args), 2)
        assert text in err, (args, err)


def test_unwritable_locations_are_reported_up_front(model_file: Path, tmp_path: Path, monkeypatch, no_work) -> None:
    """A read-only file system (or directory): simulated through os.access, since the tests
    may run as root, for whom permission bits do not bind."""
    ro_dir = tmp_path / "ro"
    ro_dir.mkdir()
    model = ro_dir / "m.safetensors"
    shutil.copy(model_file, model)
    real_access = os.access

    def access(path, mode, *a, **k):
        if Path(path).resolve() in (ro_dir.resolve(), model.resolve()) and mode & os.W_OK:
            return False
        return real_access(path, mode, *a, **k)

    monkeypatch.setattr(os, "access", access)
    runner = CliRunner()
    # the default write-back into the model file: a hint to pass --no-write
    err = _error(runner.invoke(app, ["certify", str(model), *FAST]), 2)
    assert "--no-write" in err and str(model) in err
    err = _error(runner.invoke(app, ["certify", str(model_file), "--no-write", "--per-sample",
                                     str(ro_dir / "ps.csv"), *FAST]), 2)
    assert "not writable" in err
    err = _error(runner.invoke(app, ["bench", "certify", "-o", str(ro_dir / "r.json"), *BENCH_TINY]), 2)
    assert "not writable" in err
    # lip lipschitz --write: refused before the (long) bound computation, with its own hint
    monkeypatch.setattr("lipcli.lipschitz.report.lipschitz_report",
                        lambda *a, **k: pytest.fail("the report ran before the path check"))
    err = _error(runner.invoke(app, ["lipschitz", str(model), "--write", "--no-estimate"]), 2)
    assert str(model) in err and "without --write" in err


def test_directories_that_refuse_new_files_are_caught_by_a_probe(model_file: Path, tmp_path: Path, monkeypatch, no_work) -> None:
    """What ``os.access`` cannot see (root on sysfs, ACLs): a real temporary file is tried."""
    import tempfile

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    runner = CliRunner()
    err = _error(runner.invoke(app, ["certify", str(model_file), "--no-write", "--per-sample",
                                     str(tmp_path / "ps.csv"), *FAST]), 2)
    assert "Permission denied" in err
    err = _error(runner.invoke(app, ["certify", str(model_file), *FAST]), 2)
    assert "Permission denied" in err and "--no-write" in err


def test_no_write_certifies_a_model_in_a_read_only_place(model_file: Path, tmp_path: Path, monkeypatch) -> None:
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == model_file
                        and mode & os.W_OK else real_access(p, mode, *a, **k))
    res = CliRunner().invoke(app, ["certify", str(model_file), "--no-write", "--json", *FAST])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["written"] == []


def test_a_write_failing_at_the_end_still_prints_the_results(tmp_path: Path, monkeypatch) -> None:
    path = _save(tmp_path / "w.safetensors")
    before = _sha(path)
    import lipcli.host.modelfile as modelfile

    def disk_full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(modelfile, "atomic_write_bytes", disk_full)
    runner = CliRunner()
    res = runner.invoke(app, ["certify", str(path), "--json", *FAST])
    err = _error(res, 1)
    assert "No space left on device" in err
    summary = json.loads(res.stdout)  # the results came first
    assert summary["total"] == 8 and summary["written"] == []
    assert _sha(path) == before
    # table output too, and a per-sample CSV that cannot be written at the end
    monkeypatch.undo()
    import pathlib

    real_write_text = pathlib.Path.write_text

    def fail_csv(self, *a, **k):
        if self.suffix == ".csv":
            raise OSError(28, "No space left on device")
        return real_write_text(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "write_text", fail_csv)
    res = runner.invoke(app, ["certify", str(path), "--no-write", "--per-sample",
                              str(tmp_path / "ps.csv"), *FAST])
    err = _error(res, 1)
    assert "ps.csv" in err and "No space left on device" in err
    assert "certified acc." in res.stdout


def test_bench_output_failing_at_the_end_still_prints_the_report(tmp_path: Path, monkeypatch, one_thread) -> None:
    import lipcli.host.modelfile

    def fail_write(path, data):
        raise OSError(28, "No space left on device")

    # the report is written like model files (temporary file, fsync, rename)
    monkeypatch.setattr(lipcli.host.modelfile, "atomic_write_bytes", fail_write)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["bench", "certify", "--n", "4", "-o", str(out), "--json",
                                   *BENCH_TINY])
    err = _error(res, 1)
    assert "No space left on device" in err and "--output" in err
    assert json.loads(res.stdout)["benchmark"] == "certify"
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_plot_without_suffix_is_png_at_the_given_path(model_file: Path, tmp_path: Path) -> None:
    target = tmp_path / "curve"
    res = CliRunner().invoke(app, ["certify", str(model_file), "--no-write", "--plot", str(target), *FAST])
    assert res.exit_code == 0, res.output
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "curve.png").exists()


# -- 2. class names recorded in the model file ---------------------------------------------------
def test_class_names_must_match_unless_overridden(tmp_path: Path, imagefolder_writer, cifar10_root: Path) -> None:
    runner = CliRunner()
    trained = imagefolder_writer(tmp_path / "cde", classes=("cat", "dog", "eel"))
    other = imagefolder_writer(tmp_path / "xyz", classes=("x", "y", "z"))
    record = {"name": "imagefolder", "params": {}, "num_classes": 3, "root": str(trained),
              "classes": ["cat", "dog", "eel"]}
    model = _save(tmp_path / "if.safetensors", num_classes=3, dataset=record)
    before = _sha(model)
    # the recorded data set itself: fine
    res = runner.invoke(app, ["certify", str(model), "--no-write", "--json", "-q"])
    assert res.exit_code == 0, res.output
    # another folder with the same class count but other names: refused, nothing written
    err = _error(runner.invoke(app, ["certify", str(model), "--data-dir", str(other), "-q"]), 2)
    assert "x, y, z" in err and "cat, dog, eel" in err and "--ignore-class-names" in err
    assert _sha(model) == before
    # explicit override: runs, and says so
    res = runner.invoke(app, ["certify", str(model), "--data-dir", str(other), "--ignore-class-names",
                              "--no-write", "--json", "-q"])
    assert res.exit_code == 0, res.output
    assert any("--ignore-class-names" in n for n in json.loads(res.stdout)["notes"])
    # a digits model on CIFAR-10 (10 classes each): refused, lists shortened
    digits = _save(tmp_path / "digits.safetensors")
    err = _error(runner.invoke(app, ["certify", str(digits), "--dataset", "cifar10", "--data-dir",
                                     str(cifar10_root), "--no-write", "-q"]), 2)
    assert "airplane" in err and "(10 in all)" in err
    # a model file that records no class names: as before
    unnamed = _save(tmp_path / "unnamed.safetensors", dataset={"name": "digits", "params": {}})
    res = runner.invoke(app, ["certify", str(unnamed), "--dataset", "cifar10", "--data-dir",
                              str(cifar10_root), "--no-write", "--json", "-q"])
    assert res.exit_code == 0, res.output
    assert "--ignore-class-names" in runner.invoke(app, ["certify", "--help"]).stdout


# -- 3. infinite radii ---------------------------------------------------------------------------
def test_infinite_radius_is_inf_in_json_csv_and_model_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, num_classes=10, head="lln")
    model.refresh_power_iteration(30)
    with torch.no_grad():  # every class has the same weight row: class 0 (largest bias) always wins
        model.head.weight.copy_(model.head.weight[:1].expand_as(model.head.weight))
        model.head.bias.copy_(-torch.arange(10, dtype=torch.float32))
    path = tmp_path / "inf.safetensors"
    save_model(model, path, dataset=DIGITS)
    csv_path = tmp_path / "ps.csv"
    res = CliRunner().invoke(app, ["certify", str(path), "--radii", "36", "--limit", "40", "--json",
                                   "--per-sample", str(csv_path), "-q"])
    assert res.exit_code == 0, res.output

    def reject(name):
        raise ValueError(name)

    s = json.loads(res.stdout, parse_constant=reject)
    assert s["correct"] > 0
    assert s["mean_certified_radius"]["all"] == "inf"
    assert s["mean_certified_radius"]["correct"] == "inf"
    rows = list(csv.DictReader(csv_path.open()))
    assert rows and all(r["radius"] == "inf" for r in rows)
    stored = read_metadata(path)["results"]["certify"]["mean_certified_radius"]
    assert stored["all"] == "inf" and stored["correct"] == "inf"
    table = CliRunner().invoke(app, ["certify", str(path), "--radii", "36", "--limit", "40",
                                     "--no-write", "-q"])
    assert table.exit_code == 0 and "mean certified radius: inf" in table.stdout


# -- 4. --lipschitz-iters ------------------------------------------------------------------------
@pytest.mark.parametrize("iters", ["0", "-3"])
def test_lipschitz_iters_must_be_positive(model_file: Path, iters: str, no_work) -> None:
    err = _error(CliRunner().invoke(app, ["certify", str(model_file), "--lipschitz", "estimate",
                                          "--lipschitz-iters", iters, "--no-write"]), 2)
    assert "--lipschitz-iters must be in 1..100000" in err


# -- 5. lip bench certify MODEL ------------------------------------------------------------------
def test_bench_certify_missing_model_is_a_usage_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.safetensors")
    for cmd in (["certify", missing], ["bench", "certify", missing]):
        assert "not found" in _error(CliRunner().invoke(app, cmd), 2)


@pytest.mark.parametrize("opt", [["--head", "lln"], ["--arch", "10"], ["--width", "8"],
                                 ["--pool", "max"], ["--conv", "soc"], ["--classes", "10"]])
def test_bench_certify_model_options_with_a_model_file(model_file: Path, opt: list[str], no_work) -> None:
    err = _error(CliRunner().invoke(app, ["bench", "certify", str(model_file), *opt]), 2)
    assert opt[0] in err and "--arch" in err


def test_bench_certify_model_file_still_runs(model_file: Path, one_thread) -> None:
    res = CliRunner().invoke(app, ["bench", "certify", str(model_file), "--n", "4", "--batch-size", "4",
                                   "--device", "cpu", "--threads", "1", "--json", "-q"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["settings"]["weights"].startswith("model file")


# -- 6. lip bench profile -q ---------------------------------------------------------------------
def test_bench_profile_quiet_has_a_clean_stderr(tmp_path: Path) -> None:
    """A real process: kineto reads its log level once per process, at first use."""
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run(
        [sys.executable, "-m", "lipcli", "bench", "profile", "--arch", "5", "--width", "4",
         "--batch-size", "2", "--steps", "1", "--warmup", "0", "--device", "cpu", "--threads", "1",
         "--json", "-q"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env=env,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["benchmark"] == "profile"
    assert out.stderr == "", out.stderr
