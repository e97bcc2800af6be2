"""``lip plugins``: what is installed and who provides it."""

from __future__ import annotations

import typer

from .common import cli_errors, print_json, stdout_console


@cli_errors
def plugins(
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show each component's parameters."),
) -> None:
    """List installed plugins (name, distribution, version) and the components they provide."""
    from ..plugins import KIND_TITLES, get_host, get_registry

    registry = get_registry()
    host = get_host()
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
                        {"name": p.name, "type": p.type.__name__, "default": p.default, "help": p.help}
                        for p in spec.params
                    ],
                    **({"certificate": spec.certificate, "features": spec.features}
                       if kind == "head" else {}),
                }
                for spec in registry.specs(kind)
            ]
        print_json({"plugins": [p.to_json() for p in host.plugins.values()], "components": components})
        return

    from rich.table import Table

    console = stdout_console()
    table = Table(title="Plugins", title_justify="left")
    for col in ("plugin", "distribution", "version", "provides"):
        table.add_column(col)
    for info in host.plugins.values():
        provides = "; ".join(
            f"{KIND_TITLES[k]}: {', '.join(v)}" for k, v in info.components.items()
        )
        if info.error:
            provides = f"[red]BROKEN: {info.error}[/red]"
        table.add_row(info.name, info.distribution, info.version, provides)
    console.print(table)
    comp = Table(title="Components", title_justify="left")
    for col in ("kind", "name", "plugin", "promises", "description"):
        comp.add_column(col)
    for kind, title in KIND_TITLES.items():
        for spec in registry.specs(kind):
            desc = spec.description
            if verbose and spec.params:
                desc += " [" + ", ".join(f"{p.name}={p.default!r}" for p in spec.params) + "]"
            comp.add_row(kind, spec.name, registry.provided(kind, spec.name).plugin.name,
                         ", ".join(spec.promises), desc)
    console.print(comp)
