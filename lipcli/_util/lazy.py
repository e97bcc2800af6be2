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
    name -> submodule, or a whole ``lipcli.`` module name); a looked-up name is cached in the
    package's namespace."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module if module.startswith("lipcli.") else f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__


def callable_package(package: str, module: str, function: str) -> None:
    """Make ``package`` itself callable: ``lipcli.train(...)`` calls ``lipcli.train.api.run``
    (the package stays a package: ``lipcli.train.config`` and its exports are unchanged; the
    function's module is imported on the first call)."""
    import types

    def __call__(self: types.ModuleType, *args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(f"{package}.{module}"), function)(*args, **kwargs)

    __call__.__doc__ = f"Call {package}.{module}.{function} (the Python twin of the command)."
    sys.modules[package].__class__ = type("CallablePackage", (types.ModuleType,), {"__call__": __call__})
