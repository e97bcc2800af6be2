"""lipcli's host and drivers as a plugin's tests use them (re-exported by :mod:`lipcli.testing`):
a plugin's tests import lipcli only through :mod:`lipcli.sdk`, :mod:`lipcli.numerics` and
:mod:`lipcli.testing`, so the kit names what they drive.

* :func:`plugin_registry` -- a registry of the built-ins plus the given plugins (entry points
  not loaded: hermetic, installed or not);
* :func:`registered` -- a context in which the process-wide registry (the one ``lip`` and
  :func:`run_lip <lipcli.testing.run_lip>` use) has the given plugins, whether or not their
  distribution is installed;
* :func:`installed_components` -- the components of one kind that installed distributions
  provide, to parametrise conformance tables over what is installed;
* :func:`create_model`, :func:`save_model`, :func:`load_model`, :func:`read_model_metadata`
  (model files), :func:`guaranteed_upper_bound` (the bound ``lip certify`` uses),
  :func:`perturbed_copies` (a module with its parameters moved), :func:`certify_model_file`
  (``lip certify``'s driver).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from lipcli.certify import CertifyOptions, run_certification
from lipcli.host.modelfile import read_metadata as read_model_metadata
from lipcli.host.models import create_model, load_model, save_model
from lipcli.host.plugins import (
    Registry,
    create_host,
    get_host,
    get_registry,
    register_plugin,
    unregister_plugin,
)
from lipcli.lipschitz.bound import guaranteed_upper_bound
from lipcli.lipschitz.promises import perturbed_copies
from lipcli.sdk.specs import ComponentSpec

__all__ = [
    "InstalledComponent",
    "certify_model_file",
    "create_model",
    "get_registry",
    "guaranteed_upper_bound",
    "installed_components",
    "load_model",
    "perturbed_copies",
    "plugin_registry",
    "read_model_metadata",
    "registered",
    "save_model",
]


def plugin_registry(*plugins: tuple[str, object], autoload: bool = False) -> Registry:
    """The components of the built-ins and of ``plugins`` (``(name, module)`` pairs); with
    ``autoload=True`` installed entry points too."""
    return create_host(autoload=autoload, extra=plugins).registry()


@contextmanager
def registered(*plugins: tuple[str, object]) -> Iterator[Registry]:
    """The process-wide registry with ``plugins`` (``(name, module)`` pairs) while the context
    lasts.  A plugin already registered (its distribution is installed and loaded through its
    entry point) is left as it is; the others are registered under ``name`` and removed at the
    end."""
    added = []
    try:
        for name, plugin in plugins:
            if not get_host().pm.is_registered(plugin):
                register_plugin(plugin, name)
                added.append(name)
        yield get_registry()
    finally:
        for name in reversed(added):
            unregister_plugin(name)


@dataclass(frozen=True)
class InstalledComponent:
    """A component that an installed distribution provides (:func:`installed_components`)."""

    kind: str
    name: str
    spec: ComponentSpec
    distribution: str
    #: the plugin's entry-point name and the loaded plugin module (for :func:`registered`)
    plugin: str
    module: Any


def installed_components(kind: str, registry: Registry | None = None) -> dict[str, InstalledComponent]:
    """``{name: InstalledComponent}`` of the components of ``kind`` (``"conv"``, ``"pool"``,
    ...) that installed distributions provide through their entry points (built-ins left
    out), in name order; ``registry`` defaults to a fresh one of the built-ins and the entry
    points.  Parametrise a conformance table over it, and every installed component gets the
    table's tests by being installed."""
    registry = registry or plugin_registry(autoload=True)
    found = {}
    for name in sorted(registry.names(kind)):
        provided = registry.provided(kind, name)
        info = provided.plugin
        if not info.builtin:
            found[name] = InstalledComponent(kind, name, provided.spec, info.distribution, info.name,
                                             registry.pm.get_plugin(info.name))
    return found


def certify_model_file(path: Any, *, registry: Registry | None = None, **options: Any) -> Any:
    """``lip certify``'s driver on a model file with ``options`` (the fields of
    :class:`lipcli.certify.CertifyOptions`, e.g. ``radii=[0.1], limit=16, write=False,
    attack=True``); returns its outcome (``.summary``, ``.radius``)."""
    return run_certification(path, CertifyOptions(**options), registry=registry)
