"""What ``lip train`` reads from the plugin registry: the loss parameters' shortcut options
and the help texts that list components.

A loss spec may give a parameter a ``shortcut`` (:class:`lipcli.sdk.specs.Param`): a setting
of its own, offered as ``lip train --SHORTCUT``.  The core names none of them: the options are
made here from the registry when ``lip train`` parses its command line or shows its help (not
for ``lip --help``, which stays torch-free), and :class:`RegistryCommand` hands their values
to the command as settings (``ctx.params``), never as function arguments.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
import typer.core
import typer.main

if TYPE_CHECKING:  # the registry is imported when a command runs (lip --help stays light)
    from lipcli.host.registry import Registry

#: help texts completed from the registry beyond the component lists (parameter name -> template)
_LISTED = {
    "loss": "Training loss (NAME or NAME:key=value,...): {losses} or a plugin's; default: the head's "
            "({defaults}). `lip plugins -v` lists parameters.",
    "head": "Head: {heads}.",
    "grad_clip": "Gradient-norm clipping (default: the loss's, {clips}off otherwise; 0 = off).",
}


def shortcut_options(reg: Registry) -> list[Any]:
    """One option per shortcut the installed losses declare, in registration order; the
    help names each loss that has it, with the parameter's own help."""
    owners: dict[str, list[tuple[str, Any]]] = {}
    for name in reg.names("loss"):
        for param in reg.get("loss", name).params:
            if param.shortcut:
                owners.setdefault(param.shortcut, []).append((name, param))
    params = []
    for key, having in owners.items():
        types = {p.type for _, p in having}
        text = "; ".join(f"{p.name} of {loss}: {p.help}" for loss, p in having)
        option = typer.Option("--" + key.replace("_", "-"), help=f"Sets the loss parameter {text}.")
        kind = types.pop() if len(types) == 1 else str
        params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[Optional[kind], option]))
    if not params:
        return []

    def command(**_: Any) -> None:  # Typer makes the options from this signature
        """Loss shortcuts."""

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    holder = typer.Typer(add_completion=False)
    holder.command()(command)
    return list(typer.main.get_command(holder).params)


def listed_help(reg: Registry) -> dict[str, str]:
    """The help texts of ``_LISTED``, filled from the registry."""
    heads = [(n, reg.get("head", n).loss) for n in reg.names("head")]
    clips = [(n, reg.get("loss", n).grad_clip) for n in reg.names("loss")]
    return {
        "loss": _LISTED["loss"].format(losses=", ".join(reg.names("loss")),
                                       defaults=", ".join(f"{h}: {loss}" for h, loss in heads)),
        "head": _LISTED["head"].format(heads=" or ".join(f"{h} (trained with {loss})" for h, loss in heads)),
        "grad_clip": _LISTED["grad_clip"].format(
            clips="".join(f"{clip} for {n}, " for n, clip in clips if clip > 0)),
    }


class RegistryCommand(typer.core.TyperCommand):
    """A Typer command whose options are completed from the registry on first use (parsing or
    help): the shortcut options go in before ``--grad-clip``, and the listing help texts are
    filled in.  The shortcut values stay in ``ctx.params`` for the command to read."""

    _completed = False
    _generated: frozenset[str] = frozenset()

    def get_params(self, ctx: typer.Context) -> list[Any]:
        if not self._completed:
            self._completed = True
            self._complete()
        return super().get_params(ctx)

    def _complete(self) -> None:
        from lipcli.host.plugins import get_registry  # lazy: loads the plugins (torch); lip --help stays light
        from lipcli.sdk.errors import LipError

        try:
            reg = get_registry()
        except LipError:  # the command itself reports it
            return
        from lipcli.cli.settings_options import component_help
        from lipcli.train.config import TrainConfig

        component_help(self, TrainConfig, reg.names)
        texts = listed_help(reg)
        for param in self.params:
            if param.name in texts and hasattr(param, "help"):
                param.help = texts[param.name]
        extra = shortcut_options(reg)
        self._generated = frozenset(o.name for o in extra)
        at = next((i for i, p in enumerate(self.params) if p.name == "grad_clip"), len(self.params))
        self.params[at:at] = extra

    def invoke(self, ctx: typer.Context) -> Any:
        own = {k: v for k, v in ctx.params.items() if k not in self._generated}
        return ctx.invoke(self.callback, **own) if self.callback is not None else None


def given_shortcuts(ctx: typer.Context) -> dict[str, Any]:
    """The shortcut options given on the command line, as settings."""
    command = ctx.command
    names = getattr(command, "_generated", frozenset())
    return {
        name: ctx.params[name] for name in names
        if name in ctx.params and ctx.params[name] is not None
        and (source := ctx.get_parameter_source(name)) is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
    }
