"""``lip certify``: certified accuracy of a model file at l2 radii (SPEC §4, §5)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from lipcli.lowering.caps import describe_certify_default
from lipcli.sdk.lowering_costs import BUILD_FLOP_WEIGHT, DENSE_MIN_GAIN
from lipcli.certify.options import DEFAULT_RADII, CertifyOptions
from lipcli.cli.common import ProgressBars, cli_errors, fail, print_json, stdout_console
from lipcli.cli.options import (DataDirOption, DeviceOption, DownloadOption, JsonOption, ModelArgument,
                                QuietOption, ThreadsOption)

#: the defaults the options show (written once, in CertifyOptions)
_C = CertifyOptions()
RADII_HELP = (
    "Comma-separated l2 radii. A plain number v means v/UNIT (see --radius-unit: 36 -> 36/255); "
    "an item a/b is the absolute radius a/b whatever the unit (36/255). Must be >= 0."
)
EXACT_HELP = (
    "Compute the features, logits and margins in float64 on a float64 copy of the model, every "
    "layer literal (no dense lowering): radii free of float32 rounding, for reference (slower). "
    "Recorded in the summary ('exact')."
)


# Over 80 lines: the signature is the command's option list (one Annotated option each); the
# body checks the outputs, runs lipcli.certify.run_certification and reports (helpers below).
@cli_errors
def certify(
    model: ModelArgument = None,
    radii: Annotated[str, typer.Option("--radii", help=RADII_HELP)] = DEFAULT_RADII,
    radius_unit: Annotated[float, typer.Option(
        "--radius-unit",
        help="Divisor for plain radii: 255 (pixel levels, the paper's convention) or 1 (absolute, e.g. 0.14).",
    )] = _C.radius_unit,
    dataset: Annotated[Optional[str], typer.Option(
        "--dataset", help="Data set NAME[:key=value,...] (default: the one recorded in the model file).",
    )] = _C.dataset,
    data_dir: DataDirOption = None,
    download: DownloadOption = None,
    split: Annotated[str, typer.Option("--split", help="Data set split to certify.")] = _C.split,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Only N points of the split: a seeded subset stratified by "
        "class, the same for every model and the one `lip train --limit-test N` evaluates.")] = _C.limit,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", help="Batch size for features, certificates and attacks.")] = _C.batch_size,
    device: DeviceOption = _C.device,
    lipschitz: Annotated[str, typer.Option(
        "--lipschitz",
        help="bound: GUARANTEED upper bound of Lip(g) (default, sound). estimate: the paper's product "
        "of power-method estimates (NOT guaranteed; output is labelled).",
    )] = _C.lipschitz,
    lipschitz_iters: Annotated[int, typer.Option(
        "--lipschitz-iters", help="Power iterations for --lipschitz estimate (>= 1).")] = _C.lipschitz_iters,
    top_k: Annotated[Optional[int], typer.Option(
        "--top-k",
        help="Only check the K highest other logits (reference heuristic; NOT sound unless K >= classes-1; labelled).",
    )] = _C.top_k,
    attack: Annotated[bool, typer.Option(
        "--attack",
        help="PGD-attack every certified point at each radius (a success is a soundness violation: "
        "exit 1) and report empirical robust accuracy.",
    )] = _C.attack,
    attack_steps: Annotated[int, typer.Option("--attack-steps", help="PGD steps per restart.")] = _C.attack_steps,
    attack_restarts: Annotated[int, typer.Option("--attack-restarts", help="PGD restarts.")] = _C.attack_restarts,
    per_sample: Annotated[Optional[Path], typer.Option(
        "--per-sample",
        help="Write index,label,prediction,correct,radius (input-space l2 radius of the prediction) to this CSV.",
    )] = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot",
        help="Write the certified accuracy vs radius curve (needs matplotlib: pip install 'lipcli[plot]').",
    )] = None,
    ignore_class_names: Annotated[bool, typer.Option(
        "--ignore-class-names",
        help="Certify even if the data set's class names differ from those recorded in the "
        "model file (by default that is refused: same class count, different data).",
    )] = _C.ignore_class_names,
    series: Annotated[bool, typer.Option(
        "--series",
        help="Run every layer in its literal form (e.g. SOC's 15-term series) instead of the "
        "eval lowering (a layer whose fixed linear map is cheaper as one dense matrix on this "
        "input size runs as that matrix; the bound covers it). For comparison.",
    )] = _C.series,
    dense_max_mib: Annotated[Optional[float], typer.Option(
        "--dense-max-mib",
        help="Largest dense matrix per layer of the eval lowering, MiB of float32 (default: "
        f"{describe_certify_default()}): a layer whose matrix fits and is at least "
        f"{DENSE_MIN_GAIN:g}x cheaper per input runs as that matrix (the bound covers it) when "
        "the operations it saves on this run's inputs (the --attack check: on its own passes) exceed "
        f"{BUILD_FLOP_WEIGHT}x those of building it in float64; 0: every layer literal.",
    )] = _C.dense_max_mib,
    exact: Annotated[bool, typer.Option("--exact", help=EXACT_HELP)] = _C.exact,
    compile: Annotated[Optional[bool], typer.Option("--compile/--no-compile", show_default=False,
        help="torch.compile the feature pass (features equal eager's to float rounding; the "
        "Lipschitz bound comes from the stored weights). Default: per device, eager where "
        "compiling was not measured faster (CPU: eager).")] = _C.compile,
    compile_mode: Annotated[str, typer.Option("--compile-mode", help="torch.compile mode with "
        "--compile: default, reduce-overhead or max-autotune.")] = _C.compile_mode,
    json_out: JsonOption = False,
    no_write: Annotated[bool, typer.Option(
        "--no-write",
        help="Do not modify the model file. By default the summary is stored in its 'results' slot "
        "(key 'certify') and certificate precomputations in its 'cache' slot (atomic rewrite).",
    )] = not _C.write,
    quiet: QuietOption = False,
    threads: ThreadsOption = None,
) -> None:
    """Certify l2 robustness of MODEL: clean and certified accuracy at each radius.

    Certified accuracy at eps = fraction of points correctly classified with certified
    input-space radius >= eps; radius = feature-space certificate / Lip(g), Lip(g) the
    guaranteed bound of the feature map including input normalisation.
    """
    from lipcli.certify import (
        CertifyOptions,
        ResultsNotWrittenError,
        parse_radii,
        run_certification,
    )
    from lipcli._util.outputs import check_model_writable

    from lipcli.host.runs import resolve_model_argument

    radii_list = parse_radii(radii, radius_unit)
    model = resolve_model_argument(model)
    _check_paths(model, per_sample, plot)
    from lipcli.cli.dataroot import default_root, for_certification

    root, download = for_certification(model, dataset, data_dir, download)
    options = CertifyOptions(
        radii=radii_list, radius_unit=radius_unit, dataset=dataset,
        data_dir=root, download=download, split=split,
        limit=limit, batch_size=batch_size, device=device, lipschitz=lipschitz,
        lipschitz_iters=lipschitz_iters, top_k=top_k, attack=attack, attack_steps=attack_steps,
        attack_restarts=attack_restarts, write=not no_write, ignore_class_names=ignore_class_names,
        series=series, dense_max_mib=dense_max_mib, exact=exact, compile=compile,
        compile_mode=compile_mode.strip().lower(),
    )
    options.check()
    if options.write:  # before the work, with this command's hint (the driver checks it too)
        check_model_writable(model, hint="pass --no-write to certify without modifying the model file")
    # a write that still fails at the end (disk full, ...) is reported AFTER the results are
    # printed, so that the work is not lost
    write_errors: list[str] = []
    with default_root(root if data_dir is None else None, quiet), ProgressBars(enabled=not quiet) as bars:
        try:
            outcome = run_certification(model, options, progress=bars.update)
        except ResultsNotWrittenError as exc:
            outcome = exc.outcome
            write_errors.append(str(exc))
    summary = outcome.summary
    _write_extras(outcome, per_sample, plot, radii_list, radius_unit, model, write_errors)
    if json_out:
        print_json(summary.to_json())
    else:
        print_summary(summary)
    if write_errors and not outcome.violations:
        fail("; ".join(write_errors), 1)
    if outcome.violations:
        _fail_on_violations(outcome, write_errors)


def _check_paths(model: Path, per_sample: Optional[Path], plot: Optional[Path]) -> None:
    """The model file exists; ``--plot`` / ``--per-sample`` can be written (and differ).

    Every output and option is checked before the work starts (nothing computed for
    nothing); run_certification checks them again, for library callers.
    """
    from lipcli.sdk.errors import LipUsageError
    from lipcli._util.outputs import check_output_file

    if not model.exists():
        raise LipUsageError(f"model file not found: {model}")
    if model.is_dir():
        raise LipUsageError(f"{model} is a directory, not a model file")
    if plot is not None:
        from lipcli.certify.plot import plot_format, require_matplotlib

        require_matplotlib()
        plot_format(plot)
        check_output_file(plot, "--plot")
    if per_sample is not None:
        check_output_file(per_sample, "--per-sample")
    if per_sample is not None and plot is not None and per_sample.resolve() == plot.resolve():
        raise LipUsageError(f"--per-sample and --plot name the same file {plot}")


def _write_extras(outcome: Any, per_sample: Optional[Path], plot: Optional[Path], radii_list: list[float],
                  radius_unit: float, model: Path, write_errors: list[str]) -> None:
    """The ``--per-sample`` CSV and the ``--plot``; their failures go to ``write_errors``
    (reported after the results are printed) and their paths into the summary."""
    from lipcli.sdk.errors import LipError

    summary = outcome.summary
    if per_sample is not None:
        try:
            write_per_sample_csv(per_sample, outcome)
            summary.per_sample = str(per_sample)
        except LipError as exc:
            write_errors.append(str(exc))
    if plot is not None:
        from lipcli.certify.plot import plot_certified_accuracy

        try:
            plot_certified_accuracy(
                plot, outcome.radius, outcome.correct, radii_list, unit=radius_unit,
                title=f"{model.name}: {summary.certificate.name}, Lip {summary.lipschitz.label}",
            )
            summary.plot = str(plot)
        except LipError as exc:
            write_errors.append(str(exc))


def _fail_on_violations(outcome: Any, write_errors: list[str]) -> None:
    """Exit 1 naming the first PGD success inside a certified radius (and whom to blame)."""
    first = outcome.violations[0]
    if outcome.summary.sound:
        blame = "the certificate or the Lipschitz bound is WRONG for this model (a lipcli or plugin bug)"
    else:
        blame = ("these radii come from the requested NON-guaranteed settings "
                 "(Lipschitz estimate and/or top-k classes) and over-claim")
    fail(
        f"SOUNDNESS VIOLATION: PGD broke {len(outcome.violations)} certified prediction(s) "
        f"within their certified radius (e.g. point {first.index}: certified "
        f"{first.certified_radius:.6g}, attacked at distance {first.attack_distance:.6g}); "
        + blame
        + ("; also " + "; ".join(write_errors) if write_errors else ""),
        1,
    )


def write_per_sample_csv(path: Path, outcome: Any) -> None:
    """``index,label,prediction,correct,radius`` (radius: input-space l2, of the prediction)."""
    from lipcli.sdk.errors import LipError

    lines = ["index,label,prediction,correct,radius"]
    labels = outcome.labels.tolist()
    preds = outcome.predictions.tolist()
    radius = outcome.radius.tolist()
    indices = outcome.indices if outcome.indices is not None else range(len(labels))
    for i, lab, pred, rad in zip(indices, labels, preds, radius):
        lines.append(f"{i},{lab},{pred},{int(lab == pred)},{rad!r}")
    try:
        path.write_text("\n".join(lines) + "\n")
    except OSError as exc:
        raise LipError(f"cannot write {path}: {exc.strerror or exc}") from None


def print_summary(summary: Any) -> None:
    """The paper-style table of a :class:`~lipcli.certify.CertifySummary` on stdout (rich); no
    control characters or rich markup from the model file's strings reach the terminal."""
    from rich.markup import escape
    from rich.table import Table

    from lipcli.lipschitz.promises import EVIDENCE_LABEL
    from lipcli._util.safetext import clean

    def text(value: Any) -> str:  # a string from the model file or a plugin, made inert
        return escape(clean(str(value)))

    console = stdout_console()
    say = functools.partial(console.print, soft_wrap=True)  # long labels stay on one line
    lip, cert, ds = summary.lipschitz, summary.certificate, summary.dataset
    unit = summary.radius_unit
    title = (
        f"{text(summary.arch)} + {text(summary.head)} on {text(ds.name)} ({text(ds.split)}, "
        f"{summary.total} points)"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("radius" + (f" (x1/{unit:g})" if unit != 1 else ""), justify="right")
    table.add_column("l2 radius", justify="right")
    table.add_column("certified acc.", justify="right")
    table.add_column("certified", justify="right")
    attacked = summary.attack is not None
    if attacked:
        table.add_column("PGD robust acc.", justify="right")
        table.add_column("violations", justify="right")
    table.add_row("clean", "0", f"{100 * summary.clean_accuracy:.2f}%", str(summary.correct),
                  *(["", ""] if attacked else []))
    for row in summary.radii:
        extra = []
        if attacked:
            v = row.violations or 0
            extra = [f"{100 * row.empirical_robust_accuracy:.2f}%",
                     f"[bold red]{v}[/bold red]" if v else "0"]
        table.add_row(f"{row.radius_units:g}", f"{row.radius:.4f}",
                      f"{100 * row.certified_accuracy:.2f}%", str(row.certified), *extra)
    console.print(table)
    lip_style = "green" if lip.guaranteed else "bold yellow"
    say(f"Lipschitz of features (normalisation included): [{lip_style}]{lip.value:.6g} "
        f"({text(lip.label)})[/{lip_style}]"
        + ("" if lip.guaranteed else f"; guaranteed bound {lip.upper_bound:.6g}"))
    checked = summary.promises
    if checked.layers:
        say(f"promises: {len(checked.layers)} layers counted as 1 measured at most "
            f"{checked.max_ratio:.9g} ({text(EVIDENCE_LABEL)})", highlight=False)
    cls_style = "green" if cert.exact_classes else "bold yellow"
    say(f"certificate: {text(cert.name)}, [{cls_style}]{text(cert.classes)}[/{cls_style}]")
    mcr = summary.mean_certified_radius
    fmt = lambda v: "inf" if v is None or v == float("inf") else f"{v:.4f}"  # noqa: E731
    say(f"mean certified radius: {fmt(mcr.all)} over all points (0 if misclassified), "
        f"{fmt(mcr.correct)} over correctly classified points")
    say("time: " + ", ".join(f"{text(k)} {v:.2f}s" for k, v in summary.time_s.items()))
    for note in cert.notes + summary.notes:
        say(f"note: {clean(str(note))}", highlight=False, markup=False)
    if not summary.sound:
        say("[bold yellow]These numbers are NOT guaranteed certificates (see notes).[/bold yellow]")
    if summary.written:
        say(f"stored in {text(summary.model)}: {', '.join(summary.written)}")
