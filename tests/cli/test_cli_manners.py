"""CLI manners: every help readable at 80 columns, ``--debug`` accepted after the subcommand,
a failed ``--download`` is a runtime error (exit 1), ``lip lipschitz --device`` defaults to
auto like ``lip certify``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from lipcli.cli import app, debug_first

runner = CliRunner()

COMMANDS = [[], ["train"], ["certify"], ["lipschitz"], ["info"], ["export"], ["import"], ["plugins"], ["bench"],
            ["bench", "train"], ["bench", "certify"], ["bench", "profile"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "lip")
def test_help_is_readable_at_80_columns(command):
    r = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in r.stdout  # nothing truncated
    listed = False
    for line in lines:  # command lists: each summary complete, not cut with "..."
        if line.startswith("Commands:"):
            listed = True
        elif listed and line.strip():
            assert not line.rstrip().endswith("..."), line


def test_every_option_name_is_shown_in_full():
    r = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    for name in ("--lipschitz-estimate / --no-lipschitz-estimate", "--curvature-weight",
                 "--overwrite", "--resume"):
        assert name in r.stdout


@pytest.mark.parametrize("args, expected", [
    (["certify", "m", "--debug"], ["--debug", "certify", "m"]),
    (["--debug", "certify", "m"], ["--debug", "certify", "m"]),
    (["certify", "m"], ["certify", "m"]),
    (["certify", "--", "--debug"], ["certify", "--", "--debug"]),
])
def test_debug_is_moved_to_the_front(args, expected):
    assert debug_first(args) == expected


def test_debug_after_the_subcommand_shows_the_traceback(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "lipcli", *a], capture_output=True,  # noqa: E731
                                    text=True, env=env, cwd=tmp_path, timeout=300)
    plain = run("lipschitz", "missing.safetensors")
    assert plain.returncode == 2 and plain.stderr.strip() == "error: model file not found: missing.safetensors"
    debug = run("lipschitz", "missing.safetensors", "--debug")
    assert "Traceback" in debug.stderr and "LipUsageError: model file not found" in debug.stderr


def test_a_failed_download_is_a_runtime_error(tmp_path, monkeypatch):
    import torchvision.datasets.utils

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(torchvision.datasets.utils, "download_and_extract_archive", offline)
    r = runner.invoke(app, ["train", "--dataset", "cifar10", "--data-dir", str(tmp_path / "c"),
                            "--download", "--width", "4", "--epochs", "1",
                            "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 1, r.output
    assert "could not download cifar10" in r.stderr and "network is unreachable" in r.stderr


def test_lipschitz_device_defaults_to_auto_like_certify():
    import typer.main

    def default(name: str) -> str:
        command = typer.main.get_command(app).commands[name]
        return next(p.default for p in command.params if p.name == "device")

    assert default("lipschitz") == default("certify") == "auto"


@pytest.mark.parametrize("args", [[], ["bench"]], ids=["lip", "lip bench"])
def test_a_bare_group_prints_its_help(args, tmp_path):
    """Bare ``lip`` and ``lip bench`` (no subcommand): the group's help, exit 2 (issue 26 item 2;
    typer 0.29 printed nothing)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "lipcli", *args], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 2
    assert r.stderr.startswith("Usage: lip") and "Commands:" in r.stderr
    assert ("profile" if args else "certify") in r.stderr
