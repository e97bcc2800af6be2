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
