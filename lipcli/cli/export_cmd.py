"""``lip export``: a standalone program (torch.export, TorchScript, ONNX) from a model file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from lipcli.cli.common import ProgressBars, cli_errors, print_json, stdout_console
from lipcli.cli.options import JsonOption, ModelArgument, QuietOption, ThreadsOption
from lipcli.export.options import ExportOptions
from lipcli.sdk.lowering_costs import DENSE_MIN_GAIN


# Long signature: the command's option list (one Annotated option each); the body only builds
# ExportOptions, runs lipcli.export.export_model and prints its report (print_report below).
@cli_errors
def export(
    model: ModelArgument = None,
    format: Annotated[Optional[str], typer.Option(
        "--format", "-f",
        help="pt2 (torch.export, torch alone), torchscript (torch alone) or onnx (onnxruntime "
        "alone; needs pip install 'lipcli\\[onnx]'). Default: from --output's suffix "
        "(.pt2, .torchscript.pt, .onnx), else pt2.",
    )] = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o",
        help="File to write (default: MODEL with the suffix .pt2, .torchscript.pt or .onnx).",
    )] = None,
    certify: Annotated[bool, typer.Option(
        "--certify",
        help="The program also returns the certified input-space l2 radius of each prediction "
        "(LLN: exact; CRC-Lip: closed form with guaranteed curvature bounds).",
    )] = False,
    check_inputs: Annotated[int, typer.Option(
        "--check",
        help="Inputs on which the written program is compared with lipcli (test images of the "
        "model's data set when available offline, else random images).",
    )] = ExportOptions.check_inputs,
    dense_max_mib: Annotated[float, typer.Option(
        "--dense-max-mib",
        help="Largest dense matrix per layer, MiB of float32: a layer whose fixed linear map on "
        "the program's input size fits runs as that matrix (formed exactly in float64) when "
        f"it is at least {DENSE_MIN_GAIN:g}x cheaper per input than the layer's literal form "
        "(the bound covers it); 0: every layer literal (SOC: its series of convolutions).",
    )] = ExportOptions.dense_max_mib,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing output file.")] = False,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    threads: ThreadsOption = None,
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
    options = ExportOptions(format=format, out=None if output is None else str(output),
                            certify=certify, check_inputs=check_inputs, overwrite=overwrite,
                            dense_max_mib=dense_max_mib)
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
