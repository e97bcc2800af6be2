"""Typer options derived from a settings table (:mod:`lipcli.host.settings`).

:func:`with_settings` gives a command one option per declared setting of a settings dataclass
(spelling, type, default and help from the declaration), after the command's own parameters;
the command receives them as keyword arguments and reads what was given on the command line
with :func:`given_settings`.  A setting that names a component kind has ``{names}`` in its
help: :func:`component_help` fills in the installed components (``lip train --help`` lists the
plugins' pools too); before the registry is read (``lip --help``) it says where to look.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Optional

import typer

from lipcli.host.settings import Setting, settings_of

#: the help's component list before the plugins are read
_NOT_READ = "see `lip plugins`"


def option_help(item: Setting, names: Iterable[str] | None = None) -> str:
    """The help text of a setting's option (components listed when ``names`` is given)."""
    from lipcli.sdk.errors import render_template

    def label(name: str) -> str:  # {names}: the components; {setting}: its option
        if name == "names":
            return _NOT_READ if names is None else ", ".join(names)
        return "--" + name.replace("_", "-")

    return render_template(item.help, label)


def parameter(item: Setting, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
    """The Typer parameter of one setting (``default``: the command's own, else the setting's)."""
    value = item.default if default is inspect.Parameter.empty else default
    kind: Any = item.type
    decls = list(item.flags)
    extra: dict[str, Any] = {}
    if item.type is bool:
        if item.negative:
            decls = [f"{item.option}/--no-{item.option[2:]}"]
    elif item.type is list:  # numbers, "A,B" on the command line
        kind = str
        value = None if value is None else ",".join(f"{v:g}" for v in value)
    if item.optional or value is None:
        kind = Optional[kind]
    if item.metavar is not None:
        extra["metavar"] = item.metavar
    option = typer.Option(*decls, help=option_help(item), **extra)
    return inspect.Parameter(item.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=value,
                             annotation=Annotated[kind, option])


def with_settings(cls: type, *, exclude: Iterable[str] = (), defaults: dict[str, Any] | None = None,
                  before: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the command takes one option per command-line setting of ``cls`` (those its
    own signature does not declare, less ``exclude``), inserted before its parameter
    ``before`` (default: after its own); ``defaults``: values the command shows instead of the
    declared ones (a command whose default means "the model file's")."""
    skip = set(exclude)

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(func, eval_str=True)  # its own annotations, evaluated as Typer would
        own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        names = {p.name for p in own}
        table = [parameter(s, (defaults or {}).get(s.name, inspect.Parameter.empty))
                 for s in settings_of(cls) if s.cli and s.name not in skip and s.name not in names]
        at = next((i for i, p in enumerate(own) if p.name == before), len(own))
        full = sig.replace(parameters=[*own[:at], *table, *own[at:]])
        for layer in (func, getattr(func, "__wrapped__", None)):  # the error wrapper reads the inner one
            if layer is not None:
                layer.__signature__ = full
        return func

    return wrap


def given_settings(ctx: typer.Context, cls: type) -> dict[str, Any]:
    """The settings of ``cls`` given on the command line (not those left at their default),
    as settings values (paths as strings; ``A,B`` lists as given, read by the settings)."""
    given: dict[str, Any] = {}
    for item in settings_of(cls):
        source = ctx.get_parameter_source(item.name) if item.name in ctx.params else None
        if source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
            continue
        value = ctx.params[item.name]
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, str) and item.choices is not None:
            value = value.strip().lower()
        given[item.name] = value
    return given


def component_help(command: Any, cls: type, names_of: Callable[[str], list[str]]) -> None:
    """Fill the component lists into the help of ``command``'s setting options."""
    declared = {s.name: s for s in settings_of(cls) if s.component is not None}
    for param in command.params:
        item = declared.get(param.name)
        if item is not None and hasattr(param, "help"):
            param.help = option_help(item, names_of(item.component))
