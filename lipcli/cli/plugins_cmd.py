"""``lip plugins``: what is installed and who provides it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from lipcli.cli.common import cli_errors, fail, print_json, stdout_console
from lipcli.cli.options import JsonOption

if TYPE_CHECKING:  # imported when the command runs (lip --help stays light)
    from lipcli.host.plugins import PluginHost
    from lipcli.host.registry import Registry


@cli_errors
def plugins(
    json_out: JsonOption = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show each component's parameters.")] = False,
) -> None:
    """List installed plugins (name, distribution, version) and the components they provide."""
    from lipcli.host.plugins import KIND_TITLES, get_host

    host = get_host()
    # not the process-wide (strict) registry: a duplicate name must not hide what is installed
    registry = host.registry(strict=False)
    if json_out:
        components = {}
        for kind, title in KIND_TITLES.items():
            components[title] = [
                {
                    "name": spec.name,
                    "description": spec.description,
                    "promises": list(spec.promises),
                    "plugin": registry.provided(kind, spec.name).plugin.name,
                    "distribution": registry.provided(kind, spec.name).plugin.distribution,
                    "params": [
                        {"name": p.name, "type": p.type.__name__, "default": p.default, "help": p.help,
                         "range": p.range_text() if p.has_range else None}
                        for p in spec.params
                    ],
                    **({"certificate": spec.certificate, "features": spec.features}
                       if kind == "head" else {}),
                    **({"slots": list(arch_slots(registry, spec)), "slots_vary": callable(spec.slots)}
                       if kind == "arch" else {}),
                    **(_recipe_json(registry, spec) if kind == "recipe" else {}),
                }
                for spec in registry.specs(kind)
            ]
        print_json({
            "plugins": [p.to_json() for p in host.plugins.values()],
            "components": components,
            "conflicts": registry.conflicts,
        })
    else:
        _print_tables(host, registry, verbose)
    if registry.conflicts:
        fail(registry.conflicts[0] + (f" (and {len(registry.conflicts) - 1} more)"
                                      if len(registry.conflicts) > 1 else ""), 1)


def arch_slots(registry: Registry, spec: Any) -> tuple[str, ...]:
    """The layer kinds an architecture takes from the user at its default parameters (with
    lipcli's default head, from the listing's own registry)."""
    from lipcli.host.defaults import DEFAULT_COMPONENTS

    return spec.slots_for({p.name: p.default for p in spec.params}, registry.get("head", DEFAULT_COMPONENTS["head"]))


def _print_tables(host: PluginHost, registry: Registry, verbose: bool) -> None:
    """Plugins and components as rich tables; every cell is plain text (a plugin's name,
    description or error message is never read as rich markup)."""
    from rich.table import Table
    from rich.text import Text

    from lipcli.host.plugins import KIND_TITLES

    console = stdout_console()
    table = Table(title="Plugins", title_justify="left")
    for col in ("plugin", "distribution", "version", "provides"):
        table.add_column(col)
    for info in host.plugins.values():
        provides = Text("; ".join(
            f"{KIND_TITLES[k]}: {', '.join(v)}" for k, v in info.components.items()
        ))
        if info.error:
            provides = Text(f"BROKEN: {info.error}", style="red")
        table.add_row(Text(info.name), Text(str(info.distribution)), Text(str(info.version)),
                      provides)
    console.print(table)
    comp = Table(title="Components", title_justify="left")
    for col in ("kind", "name", "plugin", "promises", "description"):
        comp.add_column(col, overflow="fold")  # a narrow terminal folds a long name, never cuts it
    for kind in KIND_TITLES:
        for spec in registry.specs(kind):
            desc = spec.description
            if verbose and spec.params:
                desc += " [" + ", ".join(
                    f"{p.name}={p.default!r}" + (f" in {p.range_text()}" if p.has_range else "")
                    for p in spec.params) + "]"
            if verbose and kind == "arch":
                desc += (" {slots at the defaults: " if callable(spec.slots) else " {slots: ") + \
                    ", ".join(arch_slots(registry, spec)) + "}"
            comp.add_row(Text(kind), Text(spec.name),
                         Text(registry.provided(kind, spec.name).plugin.name),
                         Text(", ".join(spec.promises)), Text(desc))
    console.print(comp)
    if verbose:
        for spec in registry.specs("recipe"):
            _print_recipe(console, registry, spec)


def _recipe_json(registry: Registry, spec: Any) -> dict[str, Any]:
    """A recipe's own fields for ``lip plugins --json`` (``problems``: what keeps it from
    being used with the installed components)."""
    import dataclasses

    from lipcli.host.recipes import problems

    return {"version": spec.version, "paper": spec.paper, "values": dict(spec.values),
            "sources": {k: dataclasses.asdict(v) for k, v in spec.sources.items()},
            "reported": [dataclasses.asdict(r) for r in spec.reported], "pending": list(spec.pending),
            "problems": problems(registry, spec)}


def _print_recipe(console: Any, registry: Registry, spec: Any) -> None:
    """One recipe: each value with where it was read, then what the paper reports, what
    lipcli cannot express yet, and what is missing here (plain lines, never markup)."""
    from lipcli.host.recipes import problems

    def say(text: str) -> None:
        console.print(text, soft_wrap=True, highlight=False, markup=False)

    say(f"recipe {spec.label}: {spec.paper}")
    for key, value in spec.values.items():
        say(f"  {key} = {value if isinstance(value, str) else repr(value)}   read from {spec.sources[key].text()}")
    for result in spec.reported:
        certified = ", ".join(f"{r}: {a:g}%" for r, a in result.certified.items())
        clean = "not given" if result.clean is None else f"{result.clean:g}%"
        say(f"  reported on {result.dataset}: clean {clean}, certified {certified} ({result.source})")
    for item in spec.pending:
        say(f"  not yet expressible in lipcli: {item}")
    for item in problems(registry, spec):
        say(f"  cannot be used here: {item}")
