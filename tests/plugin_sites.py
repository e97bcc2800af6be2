"""Helpers for end-to-end tests of the plugin distributions under ``plugins/``: install them
with pip into a private ``--target`` folder (the test environment stays untouched) and run
real ``lip`` subprocesses with that folder on ``PYTHONPATH`` (entry points discovered as in a
user's environment)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"


def install_plugins(names: list[str], target: Path, build: Path) -> Path:
    """``pip install --no-deps --target target`` of ``plugins/<name>`` for each name, built from
    copies under ``build`` (setuptools writes build/ and egg-info next to the sources)."""
    sources = []
    for name in names:
        src = build / name
        shutil.copytree(PLUGINS / name, src,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        sources.append(str(src))
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *sources],
        capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        pytest.fail(f"pip install of {', '.join(names)} failed: {out.stderr[-2000:]}")
    return target


def lip(args, *, site: Path | None, extra_env=None, cwd=None) -> subprocess.CompletedProcess:
    """Run ``python -m lipcli ARGS`` with ``site`` (if any) first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env.pop("LIPCLI_DISABLE_PLUGIN_AUTOLOAD", None)
    paths = [str(site)] if site else []
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "lipcli", *args], capture_output=True, text=True,
                          env=env, timeout=900, cwd=cwd)
