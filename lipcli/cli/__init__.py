"""The ``lip`` command line (Typer).

Subcommands live in their own modules and are attached here; each keeps heavy imports
inside its function so that ``lip --help`` is instant.
"""

from __future__ import annotations

import importlib
import typer

from .. import __version__
from .common import state

app = typer.Typer(
    name="lip",
    help="Train provably 1-Lipschitz convolutional networks and certify their l2 robustness.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lipcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    """lipcli: provably robust image classifiers (Singla & Feizi, NeurIPS 2022)."""
    state.debug = debug


#: (module, attribute, command name); modules are imported here, heavy libraries inside
#: each command function
_COMMANDS = (
    ("plugins_cmd", "plugins", "plugins"),
    ("train_cmd", "train", "train"),
    ("certify_cmd", "certify", "certify"),
    ("lipschitz_cmd", "lipschitz", "lipschitz"),
)

for _mod, _attr, _name in _COMMANDS:
    app.command(_name)(getattr(importlib.import_module(f"{__name__}.{_mod}"), _attr))

app.add_typer(importlib.import_module(f"{__name__}.bench_cmd").bench_app, name="bench")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="lip")
