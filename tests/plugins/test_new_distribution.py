"""Adding a plugin distribution edits no existing file: a copy of plugins/lipcli-aol under new
names (distribution ``lipcli-newconv``, package ``lipcli_newconv``, conv ``newconv``), built in
a temporary tree and pip-installed into a private folder (no network), is discovered through
its entry point and exercised by the test tables derived from the installed entry points
(tests/plugin_tables.py), and its own tests pass run from its own folder."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lipcli.testing import install_distributions

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "plugins" / "lipcli-aol"
OLD, NEW = "aol", "newconv"


def copy_renamed(source: Path, target: Path) -> Path:
    """``source`` copied to ``target`` with every lowercase ``aol`` (the distribution, package,
    module, entry-point and component names) renamed, in file contents and in paths."""
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if any(part in ("build", "__pycache__") or part.endswith(".egg-info") for part in rel.parts):
            continue
        dest = target / Path(*[part.replace(OLD, NEW) for part in rel.parts])
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(path.read_text().replace(OLD, NEW))
    return target


def pytest_run(args: list[str], *, site: Path, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m pytest ARGS -v`` in ``cwd`` with ``site`` first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env.pop("LIPCLI_DISABLE_PLUGIN_AUTOLOAD", None)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=1200)


def passed(output: str) -> list[str]:
    return re.findall(r"^(\S+) PASSED", output, re.M)


@pytest.fixture(scope="module")
def new_distribution(tmp_path_factory):
    source = copy_renamed(TEMPLATE, tmp_path_factory.mktemp("tree") / f"lipcli-{NEW}")
    site = install_distributions([source], tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("build"))
    return source, site


def test_the_copy_is_renamed(new_distribution):
    source, site = new_distribution
    assert (source / "src" / f"lipcli_{NEW}" / "plugin.py").is_file()
    assert f'{NEW} = "lipcli_{NEW}.plugin"' in (source / "pyproject.toml").read_text()
    assert not [p for p in source.rglob("*") if OLD in p.name or (p.is_file() and OLD in p.read_text())]
    assert list(site.glob(f"lipcli_{NEW}-*.dist-info"))


def test_the_entry_point_table_discovers_it(new_distribution):
    """What the derived tables parametrise over (``lipcli.testing.installed_components``) has
    the new conv, from the new distribution, in a fresh interpreter with the site on the path."""
    _, site = new_distribution
    env = dict(os.environ)
    env.pop("LIPCLI_DISABLE_PLUGIN_AUTOLOAD", None)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    code = ("from lipcli.testing import installed_components\n"
            "for name, c in installed_components('conv').items(): print(name, c.distribution, c.module.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"{NEW} lipcli-{NEW} lipcli_{NEW}.plugin" in out.stdout.splitlines(), out.stdout


@pytest.mark.slow  # two pytest runs, about two minutes
def test_the_derived_tables_discover_and_test_it(new_distribution):
    """The conformance table (tests/plugins/test_conv_plugins.py) runs on the new conv without
    an edit; the export table collects it."""
    _, site = new_distribution
    table = pytest_run(["tests/plugins/test_conv_plugins.py", "-k", f"{NEW} and not 40"], site=site, cwd=ROOT)
    assert table.returncode == 0, table.stdout[-4000:] + table.stderr[-2000:]
    ran = passed(table.stdout)
    assert f"tests/plugins/test_conv_plugins.py::test_spec_conforms[{NEW}]" in ran, ran
    assert f"tests/plugins/test_conv_plugins.py::test_lip_train_and_certify_with_the_conv[{NEW}]" in ran, ran
    assert len(ran) >= 6 and all(NEW in test for test in ran)
    export = pytest_run(["--collect-only", "-q", "tests/plugins/test_zoo_export.py"], site=site, cwd=ROOT)
    assert export.returncode == 0, export.stdout[-4000:]
    assert f"test_conv_certified_round_trip_without_lipcli[{NEW}-pt2]" in export.stdout


@pytest.mark.slow
def test_its_own_tests_pass_from_its_folder(new_distribution):
    """The copy's tests (which import only lipcli.sdk, lipcli.numerics, lipcli.testing and
    their own package) run from the distribution's folder, not lipcli's."""
    source, site = new_distribution
    shutil.rmtree(source / "src")  # the installed copy is what they test
    own = pytest_run(["tests", "-m", "not slow"], site=site, cwd=source)
    assert own.returncode == 0, own.stdout[-4000:] + own.stderr[-2000:]
    ran = passed(own.stdout)
    assert len(ran) >= 10 and "SKIPPED" not in own.stdout, own.stdout[-3000:]
