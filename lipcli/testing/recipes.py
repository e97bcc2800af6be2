"""Checks for a plugin's recipes (:class:`~lipcli.sdk.specs.RecipeSpec`), re-exported by
:mod:`lipcli.testing`:

* :func:`check_recipe` -- the spec is valid, every value is a ``lip train`` setting that
  lipcli accepts, every source names a repository, a full commit, a path and a key, and the
  recipe resolves against the registry (every component it names is installed and takes its
  parameters) exactly as ``lip train --recipe NAME`` resolves it;
* :func:`recipe_table` -- ``(recipe, setting, value, file, key)`` rows of a recipe, ``file``
  as ``owner/name@commit:path``;
* :func:`check_recipes` -- a distribution's recipes are exactly the rows of a table file
  (tab-separated, those five columns, values in JSON; ``#`` starts a comment line), written
  from the authors' files, and each passes :func:`check_recipe`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

from lipcli.host.plugins import Registry, get_registry
from lipcli.host.recipes import resolve_recipe
from lipcli.sdk.specs import RecipeSpec
from lipcli.testing.specs import check_component_spec
from lipcli.train.config import TrainConfig

__all__ = ["check_recipe", "check_recipes", "recipe_table"]

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def check_recipe(spec: RecipeSpec, registry: Registry | None = None) -> dict[str, Any]:
    """Check ``spec`` (module docstring) with ``registry`` (default: the process-wide one,
    which must hold this recipe); returns the settings the recipe gives a new run."""
    check_component_spec(spec)
    assert isinstance(spec, RecipeSpec), f"{spec.name!r} is a {type(spec).__name__}, not a RecipeSpec"
    for key, source in spec.sources.items():
        assert source.repo.count("/") == 1 and source.path and source.key.strip(), (
            f"recipe {spec.name!r}: the source of {key!r} needs owner/name, a path and a key")
        assert _COMMIT.match(source.commit), f"recipe {spec.name!r}: the source of {key!r} needs a full commit"
    for result in spec.reported:
        top = 100.0 if result.clean is None else result.clean
        assert 0 <= top <= 100 and all(0 <= a <= top for a in result.certified.values()), (
            f"recipe {spec.name!r}: reported accuracies are percentages, certified at most clean")
    settings = TrainConfig().updated(dict(spec.values), source=f"recipe {spec.name}")
    resolved = resolve_recipe(registry or get_registry(), spec.label)
    assert resolved == spec, f"the registry's recipe {spec.name!r} is another spec than the one checked"
    return {key: getattr(settings, key) for key in spec.values}


def recipe_table(spec: RecipeSpec) -> list[tuple[str, str, Any, str, str]]:
    """``(recipe, setting, value, file, key)`` for every value of ``spec``, in its order."""
    rows = []
    for key, value in spec.values.items():
        source = spec.sources[key]
        rows.append((spec.name, key, value, f"{source.repo}@{source.commit}:{source.path}", source.key))
    return rows


def _read_table(path: Path) -> list[tuple[str, str, Any, str, str]]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        assert len(cells) == 5, f"{path}:{number}: want 5 tab-separated cells, got {len(cells)}"
        rows.append((cells[0], cells[1], json.loads(cells[2]), cells[3], cells[4]))
    return rows


def check_recipes(specs: Iterable[RecipeSpec], table: str | Path, registry: Registry | None = None) -> None:
    """``specs`` (a ``lip_recipes()`` return) are exactly the rows of the file ``table``
    (module docstring), value types included, and each passes :func:`check_recipe`."""
    specs = list(specs)
    got = [row for spec in specs for row in recipe_table(spec)]
    want = _read_table(Path(table))
    for have, expected in zip(got, want):
        assert have == expected and type(have[2]) is type(expected[2]), f"recipe row {have} is not {expected}"
    assert len(got) == len(want), f"{len(got)} recipe values, the table {table} has {len(want)}"
    for spec in specs:
        check_recipe(spec, registry)
