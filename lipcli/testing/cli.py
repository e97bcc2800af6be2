"""Run ``lip`` from a plugin's tests (re-exported by :mod:`lipcli.testing`): in-process through
Typer's test runner (fast; the process-wide plugin registry) or as a real ``python -m lipcli``
subprocess (entry points discovered from scratch, as in a user's environment), and install
distributions into a private folder for such subprocesses.

* :func:`run_lip` -- ``run_lip(["train", "--conv", "mine", ...])`` returns a :class:`LipResult`
  (exit code, stdout, stderr; ``.json()`` parses stdout);
* :func:`install_distributions` -- ``pip install --no-deps --target`` of source trees (no
  network; the test environment stays untouched); pass the folder as ``run_lip(site=...)``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess as _subprocess
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LipResult", "install_distributions", "run_lip"]

#: the environment variable that makes lipcli skip entry points (cleared for subprocesses)
_AUTOLOAD_ENV = "LIPCLI_DISABLE_PLUGIN_AUTOLOAD"


@dataclass(frozen=True)
class LipResult:
    """What a ``lip`` run returned: its exit code and what it wrote."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout then stderr (for assertion messages)."""
        return self.stdout + self.stderr

    def json(self) -> Any:
        """stdout parsed as JSON (for ``--json`` runs)."""
        return json.loads(self.stdout)


def run_lip(
    args: Sequence[str], *, subprocess: bool = False, site: Path | None = None,
    env: Mapping[str, str] | None = None, cwd: Path | None = None, timeout: float = 900,
) -> LipResult:
    """Run ``lip ARGS``.

    In-process (the default) it runs Typer's test runner on lipcli's app with the process-wide
    plugin registry (plugins registered in-process are seen); an exception that escapes the
    command (a traceback a user would see) is returned as exit code 1 with the traceback in
    ``stderr``.  With ``subprocess=True`` -- implied by ``site`` or ``cwd`` -- it runs
    ``python -m lipcli ARGS`` with ``site`` (a folder from :func:`install_distributions`)
    first on ``PYTHONPATH`` and entry-point loading enabled.  ``env`` adds environment
    variables in both modes."""
    if subprocess or site is not None or cwd is not None:
        return _run_subprocess(list(args), site=site, env=env, cwd=cwd, timeout=timeout)
    from typer.testing import CliRunner

    from lipcli.cli import app

    result = CliRunner().invoke(app, list(args), env=dict(env or {}))
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        exc = result.exception
        stderr += "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return LipResult(exit_code=result.exit_code, stdout=result.stdout, stderr=stderr)


def _run_subprocess(args: list[str], *, site: Path | None, env: Mapping[str, str] | None,
                    cwd: Path | None, timeout: float) -> LipResult:
    full = dict(os.environ)
    full.pop(_AUTOLOAD_ENV, None)
    paths = [str(site)] if site is not None else []
    if full.get("PYTHONPATH"):
        paths.append(full["PYTHONPATH"])
    full["PYTHONPATH"] = os.pathsep.join(paths)
    full.update(env or {})
    proc = _subprocess.run([sys.executable, "-m", "lipcli", *args], capture_output=True, text=True,
                           env=full, timeout=timeout, cwd=cwd)
    return LipResult(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)


def install_distributions(sources: Sequence[Path], target: Path, build: Path) -> Path:
    """``pip install --no-deps --target target`` of the distributions whose source trees are
    ``sources`` (folders with a ``pyproject.toml``), built from copies under ``build``
    (setuptools writes ``build/`` and egg-info next to the sources); returns ``target``.
    Raises :class:`AssertionError` with pip's message when the install fails."""
    copies = []
    for source in map(Path, sources):
        copy = Path(build) / source.name
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        copies.append(str(copy))
    out = _subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
         "--target", str(target), *copies],
        capture_output=True, text=True, timeout=600,
    )
    names = ", ".join(Path(c).name for c in copies)
    assert out.returncode == 0, f"pip install of {names} failed: {out.stderr[-2000:]}"
    return Path(target)
