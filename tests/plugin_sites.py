"""Helpers for end-to-end tests of the plugin distributions under ``plugins/``: install them
into a private ``--target`` folder (:func:`lipcli.testing.install_distributions`; the test
environment stays untouched) and run real ``lip`` subprocesses with that folder on
``PYTHONPATH`` (entry points discovered as in a user's environment)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lipcli.testing import LipResult, install_distributions, run_lip

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"


def install_plugins(names: list[str], target: Path, build: Path) -> Path:
    """``pip install --no-deps --target target`` of ``plugins/<name>`` for each name."""
    return install_distributions([PLUGINS / name for name in names], target, build)


def lip(args, *, site: Path | None, extra_env=None, cwd=None) -> LipResult:
    """Run ``python -m lipcli ARGS`` with ``site`` (if any) first on ``PYTHONPATH``."""
    return run_lip(args, subprocess=True, site=site, env=extra_env, cwd=cwd)


def lip_using(args, *, site: Path, modules: tuple[str, ...], extra_env=None) -> LipResult:
    """Run ``lip ARGS`` with the plugins whose top-level packages are ``modules``: in-process
    (Typer's test runner) where this environment imports them all (.ci/run installs every
    distribution, so the code is the same as in ``site``), else a real ``lip`` process with
    ``site`` on ``PYTHONPATH``.  Discovery from ``site`` in a real process is each end-to-end
    test's own ``lip plugins`` subprocess; this runs the other behaviours (train, certify)."""
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return run_lip(args, env=extra_env)
    return lip(args, site=site, extra_env=extra_env)
