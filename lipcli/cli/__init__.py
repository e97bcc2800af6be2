"""The ``lip`` command line (Typer).

Subcommands live in their own modules and are attached here; each keeps heavy imports
inside its function so that ``lip --help`` is instant.
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from lipcli.version import __version__
from lipcli.cli.common import state

app = typer.Typer(
    name="lip",
    help="Train provably 1-Lipschitz convolutional networks and certify their l2 robustness.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: wraps cleanly at any width (rich truncates)
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lipcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Show the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")] = False,
) -> None:
    """lipcli: provably robust image classifiers (Singla & Feizi, NeurIPS 2022)."""
    state.debug = debug


#: (module, attribute, command name, one-line summary for `lip --help`: fits 80 columns);
#: modules are imported here, heavy libraries inside each command function
_COMMANDS = (
    ("plugins_cmd", "plugins", "plugins", "Installed plugins and the components they provide."),
    ("train_cmd", "train", "train", "Train a provably 1-Lipschitz network (resumable)."),
    ("certify_cmd", "certify", "certify", "Clean and certified accuracy of a model at l2 radii."),
    ("lipschitz_cmd", "lipschitz", "lipschitz", "Lipschitz bound and estimates of a model."),
    ("info_cmd", "info", "info", "A model file's card: components, data, bounds, results."),
    ("export_cmd", "export", "export", "A standalone program (torch or onnxruntime) of a model."),
    ("import_cmd", "import_", "import", "A model file from a checkpoint trained with another code."),
)

for _mod, _attr, _name, _summary in _COMMANDS:
    _module = importlib.import_module(f"{__name__}.{_mod}")
    # COMMAND_CLASS: a command completed from the plugin registry on use (lip train)
    app.command(_name, short_help=_summary, cls=getattr(_module, "COMMAND_CLASS", None))(getattr(_module, _attr))

app.add_typer(importlib.import_module(f"{__name__}.bench_cmd").bench_app, name="bench",
              short_help="Speed: Table 1 training steps, certification, a step profile.")


def debug_first(args: list[str]) -> list[str]:
    """``--debug`` is a global option; accept it anywhere on the command line (``lip certify
    m.safetensors --debug``) by moving it to the front (not after a ``--``)."""
    end = args.index("--") if "--" in args else len(args)
    if "--debug" not in args[:end]:
        return args
    return ["--debug", *(a for i, a in enumerate(args) if not (a == "--debug" and i < end))]


def main() -> None:
    """Console-script entry point: usage errors found while parsing the command line (an
    unknown option or command, a value of the wrong type) are one ``error: ...`` line on
    stderr and exit 2, like the errors the commands report themselves."""
    import sys

    from lipcli.cli.common import address_space_problem, other_rank

    problem = None if {"--help", "-h", "--version"} & set(sys.argv[1:]) else address_space_problem()
    if problem is not None:
        typer.echo(f"error: {problem}", err=True)
        sys.exit(1)
    try:
        code = app(args=debug_first(sys.argv[1:]), prog_name="lip", standalone_mode=False)
    except Exception as exc:  # Typer's (vendored) click exceptions, matched by shape
        name = type(exc).__name__
        if name == "NoArgsIsHelpError":  # plain ``lip`` / ``lip bench``: their help, as click shows it
            exc.show()  # type: ignore[attr-defined]
            sys.exit(2)
        if name == "Abort":
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            raise
        if other_rank():  # torchrun: rank 0 reports it
            sys.exit(exc.exit_code)
        from lipcli._util.safetext import clean

        ctx = getattr(exc, "ctx", None)
        where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        message = " ".join(clean(exc.format_message()).split())
        typer.echo(f"error: {message}{where}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
