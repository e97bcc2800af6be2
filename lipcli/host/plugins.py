"""The plugin host: a pluggy manager with built-in and entry-point plugins, and a registry.

Built-in plugins are the modules listed in :data:`BUILTIN_PLUGINS`; they are registered
exactly like third-party plugins, which are discovered through the ``lipcli`` entry-point
group.  Setting ``LIPCLI_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points (built-ins stay).

Robustness rules (pytest/datasette style):

* a plugin that raises while importing or while its hooks run is recorded with its name and
  error, skipped, and everything else keeps working;
* a hook implementation whose name is not a known ``lip_*`` hook (a misspelling) is an error
  for that plugin, not silence;
* two providers of the same component name (same kind) is an error naming both.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Iterable

import pluggy

from lipcli.version import __version__
from lipcli.sdk import hookspecs
from lipcli.sdk.errors import DuplicateComponentError, LipUsageError, PluginError, UnknownComponentError
from lipcli.sdk.specs import SPEC_KINDS, Component, ComponentSpec

ENTRY_POINT_GROUP = "lipcli"
DISABLE_AUTOLOAD_ENV = "LIPCLI_DISABLE_PLUGIN_AUTOLOAD"

#: built-in plugins: registered name -> module, in registration order. Each method's package
#: has one ``plugin`` module holding its hook implementations, exactly as an external plugin.
BUILTIN_PLUGINS: dict[str, str] = {
    "lipcli.soc": "lipcli.builtins.soc.plugin",
    "lipcli.activations": "lipcli.builtins.activations",
    "lipcli.pooling": "lipcli.builtins.pooling",
    "lipcli.lln": "lipcli.builtins.lln.plugin",
    "lipcli.crc": "lipcli.builtins.crc.plugin",
    "lipcli.lipconvnet": "lipcli.builtins.lipconvnet",
    "lipcli.datasets": "lipcli.builtins.datasets.plugin",
    "lipcli.losses": "lipcli.builtins.losses",
}

#: spec kind -> plural title (the hook's name without ``lip_``), e.g. ``"pool": "pools"``
KIND_TITLES = {kind: hook.removeprefix("lip_") for hook, kind in hookspecs.HOOK_KINDS.items()}


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
        spec = prov.spec
        resolved = {p.name: p.default for p in spec.params}
        for key, value in given.items():
            try:
                param = spec.param(key)
            except KeyError as exc:
                raise LipUsageError(str(exc).strip("\"'")) from None
            try:
                resolved[key] = param.parse(value) if isinstance(value, str) else param.check(value)
            except ValueError as exc:
                raise LipUsageError(f"{kind} {name!r}: {exc}") from None
        return Component(
            spec=spec, params=resolved, provider=prov.plugin.name,
            distribution=prov.plugin.distribution,
        )



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


def _check_hook_names(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    """Raise PluginError if ``plugin`` marks a function as a hookimpl for an unknown hook.

    pluggy itself only complains about such a function at ``check_pending()``; lipcli
    rejects the plugin up front so that a misspelling is an error, not silence.
    """
    known = set(hookspecs.HOOK_KINDS)
    for attr in dir(plugin):
        if attr.startswith("__"):
            continue
        opts = pm.parse_hookimpl_opts(plugin, attr)
        if opts is None:
            continue
        hook = opts.get("specname") or attr
        if hook not in known:
            raise PluginError(
                f"plugin {name!r} implements unknown hook {hook!r}; "
                f"known hooks: {', '.join(sorted(known))}"
            )


class PluginHost:
    """Owns the pluggy manager and plugin records; builds the :class:`Registry`."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}

    def register(
        self, plugin: object, name: str | None = None, *, distribution: str = "", version: str = "",
        builtin: bool = False,
    ) -> PluginInfo:
        """Register a module or object as a plugin (in-process registration for tests/apps).

        Raises :class:`PluginError` for a misspelt hook.
        """
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if name in self.plugins:
            raise PluginError(f"a plugin named {name!r} is already registered")
        _check_hook_names(self.pm, plugin, name)
        self.pm.register(plugin, name=name)
        info = PluginInfo(
            name=name, distribution=distribution or "(in-process)", version=version or "",
            builtin=builtin,
        )
        self.plugins[name] = info
        return info

    def record_broken(self, name: str, distribution: str, version: str, error: str) -> PluginInfo:
        info = PluginInfo(name, distribution, version, builtin=False, error=error)
        self.plugins[name] = info
        return info

    def load_builtins(self) -> None:
        for name, modname in BUILTIN_PLUGINS.items():
            module = importlib.import_module(modname)
            self.register(module, name, distribution="lipcli", version=__version__, builtin=True)

    def load_entry_points(self) -> None:
        for ep in _entry_points():
            dist = ep.dist.name if ep.dist is not None else "(unknown)"
            version = ep.dist.version if ep.dist is not None else ""
            if ep.name in self.plugins:
                existing = self.plugins[ep.name]
                if existing.distribution == dist:
                    continue  # the same distribution seen twice on the path
                self.record_broken(
                    f"{ep.name} ({dist})", dist, version,
                    f"plugin name {ep.name!r} is already used by plugin {existing.name!r} "
                    f"(distribution {existing.distribution}); entry-point names must be unique",
                )
                continue
            try:
                plugin = ep.load()
                self.register(plugin, ep.name, distribution=dist, version=version)
            except Exception as exc:  # noqa: BLE001
                self.record_broken(ep.name, dist, version, f"{type(exc).__name__}: {exc}")

    def registry(self, *, strict: bool = True) -> Registry:
        """The components of all plugins; ``strict=False`` lists duplicate names in
        ``Registry.conflicts`` instead of raising (for ``lip plugins``, so that what is
        installed can still be seen)."""
        return Registry(self.pm, self.plugins, strict=strict)

    @property
    def errors(self) -> list[PluginInfo]:
        return [p for p in self.plugins.values() if p.error]


def _entry_points() -> Iterable[md.EntryPoint]:
    return md.entry_points(group=ENTRY_POINT_GROUP)


def autoload_disabled() -> bool:
    return os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() not in ("", "0", "false", "no")


def create_host(*, autoload: bool | None = None, extra: Iterable[tuple[str, object]] = ()) -> PluginHost:
    """A host with the built-ins, entry-point plugins (unless disabled) and ``extra`` plugins."""
    host = PluginHost()
    host.load_builtins()
    if autoload is None:
        autoload = not autoload_disabled()
    if autoload:
        host.load_entry_points()
    for name, plugin in extra:
        host.register(plugin, name)
    return host


_default_host: PluginHost | None = None
_default_registry: Registry | None = None


def get_host() -> PluginHost:
    global _default_host
    if _default_host is None:
        _default_host = create_host()
    return _default_host


def get_registry() -> Registry:
    """The process-wide registry (built on first use)."""
    global _default_registry
    if _default_registry is None:
        _default_registry = get_host().registry()
    return _default_registry


def register_plugin(plugin: object | ModuleType, name: str | None = None) -> PluginInfo:
    """Register an in-process plugin with the process-wide host and rebuild the registry."""
    global _default_registry
    info = get_host().register(plugin, name)
    _default_registry = None
    try:
        get_registry()
    except Exception:
        get_host().pm.unregister(name=info.name)
        del get_host().plugins[info.name]
        _default_registry = None
        raise
    return info


def unregister_plugin(name: str) -> None:
    global _default_registry
    host = get_host()
    host.pm.unregister(name=name)
    host.plugins.pop(name, None)
    _default_registry = None


def reset() -> None:
    """Forget the process-wide host (tests; after installing or removing a distribution)."""
    global _default_host, _default_registry
    _default_host = None
    _default_registry = None
