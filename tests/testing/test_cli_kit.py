"""lipcli.testing.cli: ``run_lip`` runs the CLI in-process and as a subprocess with the same
result (exit code, one error line on stderr, JSON on stdout), returns an escaped exception as
exit 1 with its traceback, and ``install_distributions`` installs a source tree into a private
folder (or fails with pip's message)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lipcli.testing import LipResult, install_distributions, run_lip

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("subprocess", [False, True], ids=["in-process", "subprocess"])
def test_run_lip_returns_the_exit_code_and_the_streams(subprocess, tmp_path):
    listed = run_lip(["plugins", "--json"], subprocess=subprocess)
    assert isinstance(listed, LipResult) and listed.exit_code == 0, listed.output
    names = {p["name"] for p in listed.json()["plugins"]}
    assert "lipcli.soc" in names
    missing = run_lip(["certify", str(tmp_path / "none.safetensors")], subprocess=subprocess)
    assert missing.exit_code == 2 and missing.stdout == ""
    assert missing.stderr.startswith("error: model file not found") and missing.stderr.count("\n") == 1
    assert missing.output == missing.stderr


def test_run_lip_passes_the_environment(tmp_path):
    data = tmp_path / "data-root"
    result = run_lip(["plugins", "--json"], subprocess=True, env={"LIPCLI_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.exit_code == 0, result.output
    assert all(p["builtin"] for p in result.json()["plugins"])  # no entry point loaded
    (tmp_path / "x.safetensors").write_text("not a model file")
    r = run_lip(["certify", "x.safetensors"], cwd=tmp_path, env={"LIPCLI_DATA": str(data)})  # cwd: a subprocess
    assert r.exit_code in (1, 2) and "not found" not in r.stderr and r.stderr.startswith("error: "), r.stderr


def test_an_escaped_exception_is_exit_1_with_its_traceback(monkeypatch):
    """``lip --debug`` lets a bug's exception through: in-process it is returned with its
    traceback, not raised (without ``--debug``: one line, no traceback)."""
    import lipcli.host.plugins as host

    def boom():
        raise RuntimeError("a bug")

    monkeypatch.setattr(host, "get_host", boom)
    result = run_lip(["--debug", "plugins", "--json"])
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and "RuntimeError: a bug" in result.stderr
    quiet = run_lip(["plugins", "--json"])
    assert quiet.exit_code == 1 and "Traceback" not in quiet.stderr and "a bug" in quiet.stderr


def test_install_distributions_installs_into_a_private_folder(tmp_path):
    site = install_distributions([ROOT / "plugins" / "lipcli-logit-annealing"], tmp_path / "site", tmp_path / "build")
    assert (site / "lipcli_logit_annealing" / "plugin.py").is_file()
    assert list(site.glob("lipcli_logit_annealing-*.dist-info/entry_points.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(AssertionError, match="pip install of empty failed"):
        install_distributions([tmp_path / "empty"], tmp_path / "site2", tmp_path / "build2")
