"""Release check: sdist + wheel built with ``python -m build`` and installed into a fresh
venv outside the source tree (``tools/check_wheel.sh --smoke``: version, plugins, a short
quick start and one test file against the installed wheel; the full fast subset runs with
``bash tools/check_wheel.sh``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("build") is None, reason="needs the 'build' package")
def test_wheel_builds_installs_and_runs_outside_the_source_tree(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "tools" / "check_wheel.sh"), str(tmp_path), "--smoke"],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "wheel check passed" in proc.stdout
    dist = sorted(p.name for p in (tmp_path / "dist").iterdir())
    assert any(n.endswith(".tar.gz") and n.startswith("lipcli-") for n in dist)
    assert any(n.startswith("lipcli_polygon_pool-") and n.endswith(".whl") for n in dist)


def test_version_is_defined_once():
    import lipcli

    text = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and 'version = {attr = "lipcli.version.__version__"}' in text
    assert "\nversion =" not in text.split("[tool.setuptools.dynamic]")[0]
    from importlib.metadata import version

    assert version("lipcli") == lipcli.__version__
    assert (ROOT / "lipcli" / "py.typed").is_file()


DISTRIBUTIONS = sorted((ROOT / "plugins").glob("*/pyproject.toml"))


def _project(pyproject: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads(pyproject.read_text())


@pytest.mark.parametrize("pyproject", DISTRIBUTIONS, ids=lambda p: p.parent.name)
def test_every_distribution_defines_its_version_once(pyproject):
    """Each distribution under plugins/ reads its version from its package's ``__version__``
    (no second copy in pyproject.toml), and the installed metadata says the same
    (``.ci/run`` installs every ``plugins/*/``)."""
    import importlib
    import importlib.metadata as md

    config = _project(pyproject)
    project = config["project"]
    assert "version" not in project and project.get("dynamic") == ["version"], pyproject
    attr = config["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    package, _, name = attr.rpartition(".")
    assert name == "__version__"
    assert (pyproject.parent / "src" / package / "__init__.py").is_file(), attr
    try:
        installed = md.version(project["name"])
    except md.PackageNotFoundError:
        pytest.fail(f"{project['name']} is not installed (.ci/run installs every plugins/*/)")
    assert installed == importlib.import_module(package).__version__


def test_the_version_check_sees_every_distribution():
    assert len(DISTRIBUTIONS) >= 11
