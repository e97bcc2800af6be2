"""Every plugin distribution in ``plugins/`` imports only the plugin SDK surface of lipcli:
``lipcli.sdk`` (specs, hookimpl, base classes, errors, the export protocol) and
``lipcli.numerics`` (verified bound helpers); its tests add the test kit ``lipcli.testing``
(see docs/plugins.md, "What a plugin imports" and "Testing a plugin").  The SDK itself never
imports the kit."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALLOWED = ("lipcli.sdk", "lipcli.numerics")
ALLOWED_IN_TESTS = (*ALLOWED, "lipcli.testing")
SOURCES = sorted((ROOT / "plugins").glob("*/src/**/*.py"))
TESTS = sorted((ROOT / "plugins").glob("*/tests/**/*.py"))


def lipcli_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` of every import of a lipcli module, at any depth (function-local too);
    ``from lipcli import x`` counts as module ``lipcli.x``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "lipcli":
                found += [(node.lineno, f"lipcli.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name == "lipcli" or name.startswith("lipcli.")]


def allowed(module: str, surface: tuple[str, ...] = ALLOWED) -> bool:
    return any(module == a or module.startswith(a + ".") for a in surface)


def test_the_plugin_sources_and_tests_are_found():
    distributions = {p.parent.name for p in (ROOT / "plugins").glob("*/pyproject.toml")}
    assert len(distributions) >= 6
    assert {p.relative_to(ROOT / "plugins").parts[0] for p in SOURCES} == distributions
    assert {p.relative_to(ROOT / "plugins").parts[0] for p in TESTS} == distributions


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT / "plugins")))
def test_plugin_imports_only_the_sdk_surface(path):
    bad = [f"line {line}: {name}" for line, name in lipcli_imports(ast.parse(path.read_text()))
           if not allowed(name)]
    assert not bad, f"{path.relative_to(ROOT)} imports lipcli outside {ALLOWED}: {bad}"


@pytest.mark.parametrize("path", TESTS, ids=lambda p: str(p.relative_to(ROOT / "plugins")))
def test_plugin_tests_import_only_the_sdk_and_the_test_kit(path):
    """A plugin's tests run from its own folder against an installed lipcli: what they use of
    lipcli is the SDK, the numerics and the kit (no host, driver or CLI module, no helper of
    lipcli's own test tree)."""
    tree = ast.parse(path.read_text())
    bad = [f"line {line}: {name}" for line, name in lipcli_imports(tree) if not allowed(name, ALLOWED_IN_TESTS)]
    assert not bad, f"{path.relative_to(ROOT)} imports lipcli outside {ALLOWED_IN_TESTS}: {bad}"
    helpers = [f"line {line}: {name}" for line, name in helper_imports(tree)]
    assert not helpers, f"{path.relative_to(ROOT)} imports lipcli's test-tree helpers: {helpers}"


def helper_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` of imports (and ``importorskip``) of lipcli's own test helpers
    (``tests/*.py``: ``plugin_sites``, ``conftest``, ...), which a plugin's tests cannot reach
    from the plugin's folder."""
    helpers = {p.stem for p in (ROOT / "tests").glob("*.py") if not p.stem.startswith("test_")}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, str(node.args[0].value)))
    return sorted((line, name) for line, name in found if name.split(".")[0] in helpers)


def test_the_sdk_never_imports_the_kit():
    sdk = sorted((ROOT / "lipcli" / "sdk").glob("**/*.py")) + sorted((ROOT / "lipcli" / "numerics").glob("**/*.py"))
    assert sdk
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in sdk for line, name in lipcli_imports(ast.parse(p.read_text()))
           if allowed(name, ("lipcli.testing",))]
    assert not bad, bad


def test_the_check_sees_every_kind_of_import():
    """The reader flags what it must (a test that cannot fail is a defect)."""
    tree = ast.parse("import lipcli\nfrom lipcli import hookimpl\nfrom lipcli.host import plugins\n"
                     "def f():\n    from lipcli.export.driver import export_model\n"
                     "from lipcli.sdk.specs import ConvSpec\nimport lipcli.numerics.rounding\n")
    flagged = [name for _, name in lipcli_imports(tree) if not allowed(name)]
    assert flagged == ["lipcli", "lipcli.hookimpl", "lipcli.host", "lipcli.export.driver"]
    tests = ast.parse("from lipcli.testing import run_lip\nimport lipcli.testing as kit\n"
                      "from lipcli.cli import app\nfrom lipcli import create_model\n")
    flagged = [name for _, name in lipcli_imports(tests) if not allowed(name, ALLOWED_IN_TESTS)]
    assert flagged == ["lipcli.cli", "lipcli.create_model"]
    helpers = ast.parse("import plugin_sites\nimport pytest\nx = pytest.importorskip('plugin_sites')\n"
                        "from conftest import tiny\n")
    assert [name for _, name in helper_imports(helpers)] == ["plugin_sites", "plugin_sites", "conftest"]
