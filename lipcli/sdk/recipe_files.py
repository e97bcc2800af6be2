"""Recipes written as data: :func:`load_recipes` reads a TOML file of recipes (a distribution
ships it beside its plugin module and returns ``load_recipes(...)`` from ``lip_recipes()``).

The file's top level names the authors' ``repo`` (``owner/name``), the full ``commit`` and the
``paper`` its recipes come from (a recipe may name its own); each ``[recipes.NAME]`` table has a
``version``, a ``description``, optional ``pending`` (list of strings) and ``reported`` (array
of tables: ``dataset``, ``clean``, ``certified``, ``source``), ``base`` (the name of a recipe of
the same file whose values and reported accuracies it starts from) and ``values``: setting ->
``{ value = ..., path = "...", key = "...", note = "..." }``, the value with the file and key
it was read from::

    repo = "owner/method"
    commit = "0123456789abcdef0123456789abcdef01234567"
    paper = "Someone et al., A method, 2025"

    [recipes.my-method]
    version = "1"
    description = "my-method on CIFAR-10 as its authors train it"
    pending = ["the authors' eps schedule (train.py lines 115-119)"]
    values.lr = { value = 0.001, path = "configs/cifar10.yaml", key = "training.lr, line 12" }
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lipcli.sdk.recipes import RecipeResult, RecipeSource
from lipcli.sdk.specs import RecipeSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["load_recipes"]

_VALUE_KEYS = {"value", "path", "key", "note"}


def load_recipes(path: str | Path) -> list[RecipeSpec]:
    """The recipes of the TOML file at ``path`` (module docstring); ``ValueError`` naming the
    file and the recipe for a malformed one."""
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    tables = data.get("recipes")
    if not isinstance(tables, dict) or not tables:
        raise ValueError(f"{path}: no [recipes.NAME] tables")
    specs: dict[str, RecipeSpec] = {}
    for name, table in tables.items():
        try:
            specs[name] = _recipe(name, table, data, specs)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: recipe {name!r}: {exc}") from None
    return list(specs.values())


def _recipe(name: str, table: dict[str, Any], top: dict[str, Any], done: dict[str, RecipeSpec]) -> RecipeSpec:
    origin = {key: table.get(key, top.get(key)) for key in ("repo", "commit", "paper")}
    values: dict[str, Any] = {}
    sources: dict[str, RecipeSource] = {}
    reported: tuple[RecipeResult, ...] = ()
    if "base" in table:
        base = done[table["base"]]  # an earlier recipe of this file
        values, sources, reported = dict(base.values), dict(base.sources), base.reported
    for setting, entry in (table.get("values") or {}).items():
        unknown = set(entry) - _VALUE_KEYS
        if unknown or "value" not in entry:
            raise ValueError(f"value {setting!r} needs value, path and key (unknown: {sorted(unknown)})")
        values[setting] = entry["value"]
        sources[setting] = RecipeSource(repo=origin["repo"], commit=origin["commit"], path=entry["path"],
                                        key=entry["key"], note=entry.get("note", ""))
    if "reported" in table:
        reported = tuple(RecipeResult(**result) for result in table["reported"])
    return RecipeSpec(name=name, version=str(table["version"]), paper=origin["paper"],
                      description=table["description"], values=values, sources=sources,
                      reported=reported, pending=tuple(table.get("pending", ())))
