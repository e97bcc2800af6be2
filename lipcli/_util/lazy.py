"""Lazy package exports (PEP 562): a package re-exports names of its submodules and imports a
submodule only when one of its names is first used, so that e.g. ``lip --help`` reads
:mod:`lipcli.train.config` or :mod:`lipcli.export.options` without importing torch.

Usage, in the package's ``__init__``::

    _EXPORTS = {"TrainConfig": "config", "train": "loop"}
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` for ``exports`` (public
    name -> submodule); a looked-up name is cached in the package's namespace."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
