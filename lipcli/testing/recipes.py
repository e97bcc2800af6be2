"""Checks for a plugin's recipes (:class:`~lipcli.sdk.specs.RecipeSpec`), re-exported by
:mod:`lipcli.testing`:

* :func:`check_recipe` -- the spec is valid, every value is a ``lip train`` setting that
  lipcli accepts, every source names a repository, a full commit, a path and a key, and the
  recipe resolves against the registry (every component it names is installed and takes its
  parameters) exactly as ``lip train --recipe NAME`` resolves it;
* :func:`recipe_table` -- ``(setting, value, path, key)`` rows, for a table test of a recipe
  against the authors' files.
"""

from __future__ import annotations

import re
from typing import Any

from lipcli.host.plugins import Registry, get_registry
from lipcli.host.recipes import resolve_recipe
from lipcli.sdk.specs import RecipeSpec
from lipcli.testing.specs import check_component_spec
from lipcli.train.config import TrainConfig

__all__ = ["check_recipe", "recipe_table"]

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
        assert 0 <= result.clean <= 100 and all(0 <= a <= result.clean for a in result.certified.values()), (
            f"recipe {spec.name!r}: reported accuracies are percentages, certified at most clean")
    settings = TrainConfig().updated(dict(spec.values), source=f"recipe {spec.name}")
    registry = registry or get_registry()
    resolved = resolve_recipe(registry, spec.label)
    assert resolved == spec, f"the registry's recipe {spec.name!r} is another spec than the one checked"
    return {key: getattr(settings, key) for key in spec.values}


def recipe_table(spec: RecipeSpec) -> list[tuple[str, Any, str, str]]:
    """``(setting, value, path, key)`` for every value of ``spec``, in its order."""
    return [(key, value, spec.sources[key].path, spec.sources[key].key) for key, value in spec.values.items()]
