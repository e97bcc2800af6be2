"""``lip lipschitz``: per-layer and whole-network Lipschitz constant of a model (SPEC §5)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

import typer

from lipcli.certify.options import CertifyOptions
from lipcli.cli.common import ProgressBars, cli_errors, print_json, stdout_console
from lipcli.cli.options import DeviceOption, JsonOption, ModelArgument, QuietOption, ThreadsOption
from lipcli._util.devices import DEFAULT_DEVICE


@cli_errors
def lipschitz(
    model: ModelArgument = None,
    json_out: JsonOption = False,
    iters: Annotated[int, typer.Option(
        "--iters", help="Power-method iterations per layer for the estimate.",
    )] = CertifyOptions.lipschitz_iters,
    no_estimate: Annotated[bool, typer.Option(
        "--no-estimate", help="Skip the power-method estimate (bound only, fastest).")] = False,
    empirical: Annotated[bool, typer.Option(
        "--empirical",
        help="Also search for an empirical LOWER bound (largest output/input distance ratio at a few random images).",
    )] = False,
    write: Annotated[bool, typer.Option(
        "--write", help="Store the report in the model file's 'lipschitz' slot (atomic rewrite); "
        "an estimate or empirical bound not recomputed now (--no-estimate, no --empirical) keeps the "
        "stored one when it belongs to the same weights.")] = False,
    device: DeviceOption = DEFAULT_DEVICE,
    quiet: QuietOption = False,
    threads: ThreadsOption = None,
) -> None:
    """Lipschitz constant of MODEL's feature map (input normalisation included).

    Reports the GUARANTEED upper bound (product of per-layer guaranteed bounds), the paper's
    ESTIMATE (product of per-layer power-method estimates: not guaranteed) and optionally an
    empirical lower bound.
    """
    from lipcli.lipschitz.api import run

    with ProgressBars(enabled=not quiet) as bars:
        report = run(model, iters=iters, no_estimate=no_estimate, empirical=empirical, write=write,
                     device=device, progress=bars.update, write_hint="run without --write to only print the report")
    if json_out:
        print_json(report.to_json())
    else:
        print_report(report)


def print_report(report: Any) -> None:
    """A :class:`~lipcli.lipschitz.report.LipschitzReport` as a table on stdout (rich); strings
    from the model file are made inert (no control characters, no markup)."""
    from rich.markup import escape
    from rich.table import Table

    from lipcli.lipschitz.promises import EVIDENCE_LABEL
    from lipcli._util.safetext import clean

    def text(value: Any) -> str:
        return escape(clean(str(value)))

    console = stdout_console()
    say = functools.partial(console.print, soft_wrap=True)  # long labels stay on one line
    table = Table(title=f"Lipschitz constants of {text(report.model)}", title_justify="left")
    for col, just in (("layer", "left"), ("type", "left"), ("input shape", "left"),
                      ("upper bound", "right"), ("estimate", "right")):
        table.add_column(col, justify=just)
    for row in report.layers:
        bound = "1 (promise)" if row.source == "promise" else f"{row.upper_bound:.8g}"
        est = "" if row.estimate is None else f"{row.estimate:.8g}"
        table.add_row(text(row.name), text(row.type), "x".join(map(str, row.input_shape)), bound, est)
    console.print(table)
    say(f"[green]whole network {text(report.upper_bound_label)}: {report.upper_bound:.8g}[/green]"
        " (normalisation included)")
    if report.estimate is not None:
        rel = report.estimate / report.upper_bound - 1
        say(f"[yellow]{text(report.estimate_label)}: {report.estimate:.8g}[/yellow] "
            f"({100 * rel:+.4f}% vs bound; {report.estimate_iters} iterations)")
    checked = report.promises
    if checked is not None and checked.layers:
        say(f"promises: {len(checked.layers)} layers counted as 1 measured at most "
            f"{checked.max_ratio:.9g} ({text(EVIDENCE_LABEL)})")
    emp = report.empirical_lower
    if emp:
        say(f"{text(emp.label)}: {emp.value:.8g} ({emp.points} {text(emp.source)})")
    say("time: " + ", ".join(f"{k} {v:.2f}s" for k, v in report.time_s.items()))
    if report.written:
        kept = report.carried_over
        say(f"stored in {text(report.model)}: lipschitz"
            + (f" (kept the file's {' and '.join(kept)} for these weights: not recomputed)" if kept else ""))
