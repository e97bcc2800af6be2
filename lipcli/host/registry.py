"""The plugin registry: every component of every registered plugin, by kind and name.

:class:`Registry` collects what the plugins of a :class:`lipcli.host.plugins.PluginHost`
provide (one :class:`PluginInfo` per plugin), rejects a hook that returns the wrong spec type
(that plugin is recorded as broken, everything else keeps working) and two providers of the
same component name, and answers the queries: names, specs, and a component choice
(``"name:key=value,…"`` or a config dict, :func:`parse_component_choice`) resolved to a
:class:`~lipcli.sdk.specs.Component`.  Discovery and loading of the plugins, and the
process-wide host, live in :mod:`lipcli.host.plugins`, which re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pluggy

from lipcli.sdk import hookspecs
from lipcli.sdk.errors import ComponentValueError, DuplicateComponentError, LipUsageError, UnknownComponentError
from lipcli.sdk.specs import SPEC_KINDS, Component, ComponentSpec

__all__ = [
    "DISABLE_AUTOLOAD_ENV", "PluginInfo", "Provided", "Registry", "natural_key",
    "parse_component_choice", "split_component_choices",
]

#: environment variable that, set to 1, skips the entry-point plugins (read by
#: :func:`lipcli.host.plugins.autoload_disabled`; named here in the duplicate-name error)
DISABLE_AUTOLOAD_ENV = "LIPCLI_DISABLE_PLUGIN_AUTOLOAD"


@dataclass
class PluginInfo:
    """One registered (or broken) plugin and what it provides."""

    name: str
    distribution: str
    version: str
    builtin: bool
    components: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "builtin": self.builtin,
            "components": self.components,
            "error": self.error,
        }


@dataclass(frozen=True)
class Provided:
    spec: ComponentSpec
    plugin: PluginInfo


def natural_key(name: str) -> tuple:
    """Sort key comparing digit runs as numbers (``lipconvnet-5`` before ``lipconvnet-10``)."""
    import re

    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


class Registry:
    """All components of all plugins, by kind and name."""

    def __init__(
        self, pm: pluggy.PluginManager, plugins: dict[str, PluginInfo], *, strict: bool = True
    ) -> None:
        self.pm = pm
        self.plugins = plugins
        self.strict = strict
        #: duplicate-name messages (only collected when ``strict`` is false; a strict
        #: registry raises :class:`DuplicateComponentError` at the first one)
        self.conflicts: list[str] = []
        self._by_kind: dict[str, dict[str, Provided]] = {kind: {} for kind in SPEC_KINDS}
        self._collect()

    # -- building ---------------------------------------------------------------------------
    def _collect(self) -> None:
        for info in self.plugins.values():  # recomputed by every registry built from the host
            info.components.clear()
        for hook_name, kind in hookspecs.HOOK_KINDS.items():
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                info = self.plugins[impl.plugin_name]
                if info.error:
                    continue
                try:
                    specs = impl.function()
                    specs = self._validate_return(hook_name, kind, specs)
                except Exception as exc:  # noqa: BLE001 - a broken plugin must not break us
                    info.error = f"{hook_name} failed: {type(exc).__name__}: {exc}"
                    self._forget(info)
                    continue
                for spec in specs:
                    self._add(kind, spec, info)

    @staticmethod
    def _validate_return(hook_name: str, kind: str, specs: Any) -> list[ComponentSpec]:
        if specs is None:
            return []
        if isinstance(specs, ComponentSpec):
            specs = [specs]
        specs = list(specs)
        expected = SPEC_KINDS[kind]
        for spec in specs:
            if not isinstance(spec, expected):
                raise TypeError(
                    f"{hook_name} must return {expected.__name__} objects, got {type(spec).__name__}"
                )
        return specs

    def _add(self, kind: str, spec: ComponentSpec, info: PluginInfo) -> None:
        table = self._by_kind[kind]
        if spec.name in table:
            other = table[spec.name].plugin
            message = (
                f"{kind} {spec.name!r} is provided twice: by plugin {other.name!r} "
                f"(distribution {other.distribution}) and by plugin {info.name!r} "
                f"(distribution {info.distribution})"
            )
            if self.strict:
                raise DuplicateComponentError(
                    f"{message}; uninstall one of them (see `lip plugins`), or set "
                    f"{DISABLE_AUTOLOAD_ENV}=1 to load no installed plugins"
                )
            self.conflicts.append(message)  # the first provider keeps the name
            info.components.setdefault(kind, []).append(spec.name)  # but both provide it
            return
        table[spec.name] = Provided(spec, info)
        info.components.setdefault(kind, []).append(spec.name)

    def _forget(self, info: PluginInfo) -> None:
        for kind, names in info.components.items():
            for name in names:
                self._by_kind[kind].pop(name, None)
        info.components.clear()

    # -- queries ----------------------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        """Names in natural order (``lipconvnet-5`` before ``lipconvnet-10``)."""
        return sorted(self._by_kind[kind], key=natural_key)

    def specs(self, kind: str) -> list[ComponentSpec]:
        return [self._by_kind[kind][n].spec for n in self.names(kind)]

    def get(self, kind: str, name: str) -> ComponentSpec:
        return self.provided(kind, name).spec

    def provided(self, kind: str, name: str) -> Provided:
        if kind not in self._by_kind:
            raise ValueError(f"unknown component kind {kind!r}")
        try:
            return self._by_kind[kind][name]
        except KeyError:
            raise UnknownComponentError(kind, name, self.names(kind)) from None

    def component(
        self, kind: str, choice: str | dict[str, Any], params: dict[str, Any] | None = None
    ) -> Component:
        """Resolve ``"name"``, ``"name:key=value,key=value"`` or a config dict to a Component.

        Unknown names raise :class:`UnknownComponentError`; bad parameters raise
        :class:`LipUsageError` naming the valid ones.
        """
        if isinstance(choice, dict):
            name, given = choice["name"], dict(choice.get("params") or {})
        else:
            name, given = parse_component_choice(choice)
        given.update(params or {})
        prov = self.provided(kind, name)
        try:
            resolved = prov.spec.resolve_params(given, from_text=True)
        except KeyError as exc:  # an unknown parameter: the message names the valid ones
            raise LipUsageError(str(exc.args[0])) from None
        except ValueError as exc:
            raise ComponentValueError(_rejection(kind, name, prov.spec, given, exc)) from None
        return Component(
            spec=prov.spec, params=resolved, provider=prov.plugin.name,
            distribution=prov.plugin.distribution,
        )


def _rejection(kind: str, name: str, spec: ComponentSpec, given: dict[str, Any], exc: ValueError) -> str:
    """``KIND 'NAME' rejected KEY=VALUE: REASON`` for the first given value its parameter
    refuses (``KIND 'NAME': REASON`` if none alone does)."""
    for key, value in given.items():
        try:
            spec.resolve_params({key: value}, from_text=True)
        except ValueError:
            return f"{kind} {name!r} rejected {key}={value}: {exc}"
    return f"{kind} {name!r}: {exc}"


def parse_component_choice(text: str) -> tuple[str, dict[str, str]]:
    """Split ``"name:key=value,key=value"`` into the name and raw string parameters."""
    name, _, rest = text.strip().partition(":")
    if not name:
        raise LipUsageError(f"empty component name in {text!r}")
    params: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise LipUsageError(f"bad component parameter {item!r} in {text!r}; use key=value")
            if key.strip() in params:
                raise LipUsageError(f"parameter {key.strip()!r} given twice in {text!r}")
            params[key.strip()] = value.strip()
    return name.strip(), params


def component_choice_text(name: str, params: dict[str, Any]) -> str:
    """``"name:key=value,..."`` with every parameter written out (the inverse of
    :func:`parse_component_choice`; floats as ``repr``, booleans as ``true``/``false``)."""
    def text(v: Any) -> str:
        return ("true" if v else "false") if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v)

    return name + ("" if not params else ":" + ",".join(f"{k}={text(v)}" for k, v in params.items()))


def split_component_choices(text: str) -> list[str]:
    """Split a comma-separated list of component choices, keeping inline parameters with
    their component: ``"soc-fast,polygon:vertices=8,radius=1.5,max"`` ->
    ``["soc-fast", "polygon:vertices=8,radius=1.5", "max"]``.  An item containing ``=`` but
    no ``:`` continues the previous item's parameters (names never contain ``=``)."""
    items: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise LipUsageError(f"empty item in the component list {text!r}")
        if "=" in item and ":" not in item:
            if not items or ":" not in items[-1]:
                raise LipUsageError(
                    f"parameter {item!r} in {text!r} follows no component; use name:key=value"
                )
            items[-1] += "," + item
        else:
            items.append(item)
    return items
