"""``lip export``: a standalone program (torch.export, TorchScript, ONNX) from a model file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lipcli.cli.common import ProgressBars, cli_errors, print_json, stdout_console
from lipcli.cli.options import JsonOption, ModelArgument, QuietOption, ThreadsOption
from lipcli.cli.settings_options import with_settings
from lipcli.export.options import ExportOptions


# Every ExportOptions setting is an option (with_settings); the signature lists the others.
@with_settings(ExportOptions, before="json_out")
@cli_errors
def export(
    model: ModelArgument = None,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    threads: ThreadsOption = None,
    **settings: Any,
) -> None:
    """Export MODEL as a program that runs without lipcli.

    The eval-mode network (normalisation, every SOC layer as its fixed
    series of plain convolutions or, on small images, as the same linear
    map in one dense matrix, pooling, head) is written with a metadata
    record: lipcli version, config, normalisation, Lipschitz bound,
    certificate, source model hash.  The file is then loaded in the target
    runtime and compared with lipcli; a relative difference above 1e-5 is
    an error and nothing is written.
    """
    from lipcli.export import export_model
    from lipcli.host.runs import resolve_model_argument

    path = resolve_model_argument(model)
    options = ExportOptions(**{k: str(v) if isinstance(v, Path) else v for k, v in settings.items()})
    with ProgressBars(enabled=not quiet) as bars:
        report = export_model(path, options, progress=bars.update)
    if json_out:
        print_json(report.to_json())
    else:
        print_report(report)


def print_report(report: Any) -> None:
    """An :class:`~lipcli.export.ExportReport` for people (stdout)."""
    console = stdout_console()
    check = report.check
    say = lambda text: console.print(text, soft_wrap=True, highlight=False)  # noqa: E731
    say(f"wrote {report.output} ({report.format}, {report.bytes:,} bytes; runs with "
        f"{report.runtime})")
    outputs = " and ".join(report.record["outputs"])  # the program's metadata record (JSON)
    say(f"outputs: {outputs}" + (f"; certificate {report.certificate}, guaranteed Lipschitz "
                                 f"bound {report.lipschitz_upper_bound:.8g}"
                                 if report.certificate else ""))
    lowering = report.record.get("lowering") or {}  # the metadata record (JSON)
    layers = lowering.get("layers") or []
    if layers:
        dense = lowering.get("dense_layers") or []
        say(f"lowering: {len(dense)} of {len(layers)} layers as one dense matrix"
            + (f" ({', '.join(dense)}; {lowering.get('dense_mib', 0.0):.1f} MiB)" if dense else "")
            + f", the others as their series (cap {lowering.get('dense_max_mib', 0):g} MiB per layer)")
    radius = check.max_rel_radius_diff
    say(f"check on {check.source}: max relative logit difference "
        f"{check.max_rel_logit_diff:.3g}"
        + ("" if radius is None else f", radius difference {radius:.3g}")
        + f", {check.prediction_mismatches} different predictions")
