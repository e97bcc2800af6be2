"""The source stays readable: no module over 400 lines and no function over 80 lines in
``lipcli/`` and ``plugins/*/src`` (a function in ``lipcli/cli`` counts from its body: a Typer
command's signature declares every option and is exempt)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    roots = [ROOT / "lipcli", *sorted((ROOT / "plugins").glob("*/src"))]
    return sorted(path for root in roots for path in root.rglob("*.py"))


def long_functions(path: Path, root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``"path:line name (N lines)"`` for each function of ``path`` longer than ``limit``
    lines; under ``root/lipcli/cli`` a function counts from its body."""
    signature_exempt = (root / "lipcli" / "cli") in path.parents
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = node.body[0].lineno if signature_exempt else node.lineno
            lines = node.end_lineno - start + 1
            if lines > limit:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_the_scan_sees_the_sources():
    names = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert "lipcli/certify/driver.py" in names and "lipcli/cli/train_cmd.py" in names
    assert any(name.startswith("plugins/") for name in names)


def test_the_scan_finds_a_long_function_and_exempts_only_command_signatures(tmp_path):
    signature = "def f(\n" + "".join(f"    a{i}: int = {i},\n" for i in range(10)) + "):\n"
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 5))
    source = signature + '    """Doc."""\n' + body
    for folder in ("lipcli/cli", "lipcli/certify"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "probe.py").write_text(source, encoding="utf-8")
    assert long_functions(tmp_path / "lipcli/cli/probe.py", tmp_path) == []
    assert long_functions(tmp_path / "lipcli/certify/probe.py", tmp_path) == [
        f"lipcli/certify/probe.py:1 f ({MAX_FUNCTION_LINES + 8} lines)"]


# one test over every source file each (not one collected test per file: the per-test overhead
# was most of their time); the message names every offending file or function


def test_no_module_over_400_lines():
    over = [f"{path.relative_to(ROOT)} has {lines} lines"
            for path in _sources()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert over == [], "split these modules: " + "; ".join(over)


def test_no_function_over_80_lines():
    found = [entry for path in _sources() for entry in long_functions(path)]
    assert found == [], "split these into named steps: " + "; ".join(found)
