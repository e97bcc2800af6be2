"""The plugin host: a pluggy manager with built-in and entry-point plugins, and a registry.

This module discovers, loads and registers the plugins and holds the process-wide host; the
:class:`Registry` of their components (and :class:`PluginInfo`, :func:`natural_key`,
:func:`parse_component_choice`, :func:`split_component_choices`) lives in
:mod:`lipcli.host.registry` and is also importable from here.

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
from types import ModuleType
from typing import Iterable

import pluggy

from lipcli.version import __version__
from lipcli.sdk import hookspecs
from lipcli.sdk.errors import PluginError
from lipcli.host.registry import (  # noqa: F401 - re-exported: `from lipcli.host.plugins import Registry`
    DISABLE_AUTOLOAD_ENV,
    PluginInfo,
    Provided,
    Registry,
    natural_key,
    parse_component_choice,
    split_component_choices,
)

ENTRY_POINT_GROUP = "lipcli"

#: built-in plugins: registered name -> module, in registration order. Every built-in is a
#: package whose ``plugin`` module holds its hook implementations, exactly as an external plugin.
BUILTIN_PLUGINS: dict[str, str] = {
    "lipcli.soc": "lipcli.builtins.soc.plugin",
    "lipcli.activations": "lipcli.builtins.activations.plugin",
    "lipcli.pooling": "lipcli.builtins.pooling.plugin",
    "lipcli.lln": "lipcli.builtins.lln.plugin",
    "lipcli.crc": "lipcli.builtins.crc.plugin",
    "lipcli.lipconvnet": "lipcli.builtins.lipconvnet.plugin",
    "lipcli.datasets": "lipcli.builtins.datasets.plugin",
    "lipcli.losses": "lipcli.builtins.losses.plugin",
    "lipcli.augmentations": "lipcli.builtins.augmentations.plugin",
    "lipcli.optimizers": "lipcli.builtins.optimizers.plugin",
}

#: spec kind -> plural title (the hook's name without ``lip_``), e.g. ``"pool": "pools"``
KIND_TITLES = {kind: hook.removeprefix("lip_") for hook, kind in hookspecs.HOOK_KINDS.items()}


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
