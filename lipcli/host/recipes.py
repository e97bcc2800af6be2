"""Recipes against the installed components: ``lip train --recipe NAME[@VERSION]`` resolves
here, and a recipe that names a component that is not installed (or a parameter it does not
take) is refused with one line naming the value, not at training time.

A recipe (:class:`~lipcli.sdk.specs.RecipeSpec`) is registered like any component; its
``values`` are ``lip train`` settings, and those that name components (:data:`COMPONENT_SETTINGS`)
are resolved with :meth:`~lipcli.host.registry.Registry.component` exactly as the command line's.
"""

from __future__ import annotations

from typing import Any

from lipcli.host.defaults import COMPONENT_SETTINGS
from lipcli.host.registry import Registry
from lipcli.sdk.errors import LipError, LipUsageError
from lipcli.sdk.specs import RecipeSpec


__all__ = ["COMPONENT_SETTINGS", "overrides", "problems", "resolve_recipe", "split_label"]


def split_label(text: str) -> tuple[str, str | None]:
    """``"name@version"`` -> ``("name", "version")``; ``"name"`` -> ``("name", None)``."""
    name, sep, version = text.strip().partition("@")
    if not name or (sep and not version.strip()):
        raise LipUsageError(f"bad recipe {text!r}; use NAME or NAME@VERSION (see `lip plugins -v`)")
    return name, version.strip() if sep else None


def problems(registry: Registry, spec: RecipeSpec) -> list[str]:
    """What keeps ``spec`` from being used here: each value naming a component that is not
    installed, or a parameter or value that component refuses (one phrase each)."""
    found = []
    for key in COMPONENT_SETTINGS:  # each names a component of the kind of the same name
        value = spec.values.get(key)
        if not isinstance(value, str):
            continue
        try:
            registry.component(key, value)
        except LipError as exc:
            found.append(f"{key} {value!r}: {str(exc).splitlines()[0]}")
    return found


def resolve_recipe(registry: Registry, text: str) -> RecipeSpec:
    """The installed recipe ``text`` (``NAME`` or ``NAME@VERSION``), checked against the
    installed components; :class:`LipUsageError` (one line) when it is unknown, of another
    version, or names what is not installed."""
    name, version = split_label(text)
    provided = registry.provided("recipe", name)  # UnknownComponentError lists the valid names
    spec = provided.spec
    assert isinstance(spec, RecipeSpec)
    if version is not None and version != spec.version:
        raise LipUsageError(f"recipe {name!r} is installed at version {spec.version}, not {version} "
                            f"(distribution {provided.plugin.distribution})")
    found = problems(registry, spec)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise LipUsageError(f"recipe {spec.label} (distribution {provided.plugin.distribution}) "
                            f"cannot be used here: {found[0]}{more}")
    return spec


def overrides(spec: RecipeSpec, final: dict[str, Any], given: set[str]) -> dict[str, dict[str, Any]]:
    """The settings given explicitly (``given``) whose final value differs from the
    recipe's: key -> ``{"recipe": its value, "value": the one used}``."""
    return {key: {"recipe": spec.values.get(key), "value": final.get(key)}
            for key in sorted(given) if key in final and final.get(key) != spec.values.get(key)}


def new_settings(defaults: Any, recipe: str | None = None, file_data: dict[str, Any] | None = None,
                 file_name: str = "settings file", given: dict[str, Any] | None = None) -> Any:
    """A new run's settings, in the one order of precedence (:func:`lipcli.host.settings.layered`):
    ``defaults`` (a :class:`~lipcli.train.config.TrainConfig`), the recipe (``recipe``, else a
    settings file's ``recipe`` key), the settings file, the settings ``given`` (command line or
    keyword arguments).  With a recipe, its ``name@version`` and the settings given over it are
    recorded (``recipe``, ``recipe_overrides``)."""
    import dataclasses

    from lipcli.host.plugins import get_registry
    from lipcli.host.settings import layered, without_width

    data = {str(k).replace("-", "_"): v for k, v in (file_data or {}).items()}
    named = data.pop("recipe", None)
    data.pop("recipe_overrides", None)  # recomputed: a stored config may be read back as a file
    given = dict(given or {})
    recipe = recipe if recipe is not None else named
    if recipe is not None and not isinstance(recipe, str):
        raise LipUsageError(f"{file_name}: setting 'recipe' must be a string, got {recipe!r}")
    spec = None if recipe is None else resolve_recipe(get_registry(), recipe)
    cfg = layered(defaults, recipe=spec, file_data=data if file_data is not None else None,
                  file_name=file_name, given=given, before_layer=without_width)
    if spec is None:
        return cfg
    explicit = set(data) | set(given)
    if "warmup_epochs" not in explicit and cfg.warmup_epochs > cfg.epochs:  # e.g. a short trial run
        raise LipUsageError(f"recipe {spec.label} warms up for {cfg.warmup_epochs:g} epochs, more than "
                            f"--epochs {cfg.epochs}; give --warmup-epochs too")
    return dataclasses.replace(cfg, recipe=spec.label, recipe_overrides=overrides(spec, cfg.to_json(), explicit))
