"""Every plugin distribution in ``plugins/`` imports only the plugin SDK surface of lipcli:
``lipcli.sdk`` (specs, hookimpl, base classes, errors, the export protocol) and
``lipcli.numerics`` (verified bound helpers); see docs/plugins.md, "What a plugin imports"."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALLOWED = ("lipcli.sdk", "lipcli.numerics")
SOURCES = sorted((ROOT / "plugins").glob("*/src/**/*.py"))


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


def allowed(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ALLOWED)


def test_the_plugin_sources_are_found():
    assert len({p.relative_to(ROOT / "plugins").parts[0] for p in SOURCES}) >= 6


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT / "plugins")))
def test_plugin_imports_only_the_sdk_surface(path):
    bad = [f"line {line}: {name}" for line, name in lipcli_imports(ast.parse(path.read_text()))
           if not allowed(name)]
    assert not bad, f"{path.relative_to(ROOT)} imports lipcli outside {ALLOWED}: {bad}"


def test_the_check_sees_every_kind_of_import():
    """The reader flags what it must (a test that cannot fail is a defect)."""
    tree = ast.parse("import lipcli\nfrom lipcli import hookimpl\nfrom lipcli.host import plugins\n"
                     "def f():\n    from lipcli.export.driver import export_model\n"
                     "from lipcli.sdk.specs import ConvSpec\nimport lipcli.numerics.rounding\n")
    flagged = [name for _, name in lipcli_imports(tree) if not allowed(name)]
    assert flagged == ["lipcli", "lipcli.hookimpl", "lipcli.host", "lipcli.export.driver"]
