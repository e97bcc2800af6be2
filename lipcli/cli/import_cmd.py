"""``lip import``: a checkpoint saved by another project's code -> a lipcli model file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, List, Optional

import typer

from lipcli._util.safetext import clean
from lipcli.cli.common import cli_errors, print_json
from lipcli.cli.options import DataDirOption, DownloadOption, JsonOption, ThreadsOption


@cli_errors
def import_(
    checkpoint: Annotated[Path, typer.Argument(
        help="The checkpoint (.pt/.pth state dict, .safetensors or .npz) saved by the source's code.",
        show_default=False)],
    source: Annotated[str, typer.Option(
        "--from", help="The importer of the code that saved it (see `lip plugins`: importers).",
        show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", help="Model file to write (.safetensors).",
                                      show_default=False)],
    arch: Annotated[Optional[str], typer.Option(
        "--arch", help="The source's architecture, when the checkpoint's shapes do not decide it "
        "(the importer's words, e.g. lipconvnet-10).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing model file.")] = False,
    config: Annotated[Optional[Path], typer.Option(
        "--config", help="The source's own configuration (a JSON object such as the config.json its "
        "training script wrote, or its YAML config): the options the checkpoint's shapes cannot tell.",
        show_default=False)] = None,
    option: Annotated[Optional[List[str]], typer.Option(
        "--option", help="NAME=VALUE: one option of the source's configuration, by the source's name "
        "(e.g. act_name=MinMax); repeatable.", show_default=False)] = None,
    verify: Annotated[Optional[Path], typer.Option(
        "--verify", help="INPUTS_AND_LOGITS.npz ('inputs' (N,C,H,W) in [0,1], 'logits' (N,K) from the "
        "source's code in eval mode): refuse to write the model file unless its logits match.",
        show_default=False)] = None,
    verify_tolerance: Annotated[float, typer.Option(
        "--verify-tolerance", help="--verify: the largest difference allowed, "
        "relative to max(1, max |logit|).")] = 1e-4,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Then certify the imported model on its data set both ways: the source's "
        "own rule (its Lipschitz estimate, head formula, top-k) and lipcli's (guaranteed bound, all "
        "classes), per radius, with the number of points only the source certifies.")] = False,
    radii: Annotated[str, typer.Option(
        "--radii", help="--compare: comma-separated l2 radii in 1/255 units (36 -> 36/255), "
        "or a/b absolute.")] = "36,72,108",
    dataset: Annotated[Optional[str], typer.Option(
        "--dataset", help="--compare: data set NAME (default: the source's, recorded in the "
        "model file).")] = None,
    data_dir: DataDirOption = None,
    download: DownloadOption = None,
    limit: Annotated[Optional[int], typer.Option(
        "--limit", min=1, help="--compare: only N points of the test split (seeded, stratified).")] = None,
    json_out: JsonOption = False,
    threads: ThreadsOption = None,
) -> None:
    """Import CHECKPOINT, trained with another project's code, as a lipcli model file.

    The checkpoint is read without running code (a pickle that names anything beyond
    tensors and plain containers is refused), its keys and shapes are checked against
    the architecture the importer declares, and the model file records the config, the
    GUARANTEED Lipschitz bound, the data set and the provenance (source, checkpoint
    SHA-256).  Certify it with `lip certify OUT`.
    """
    from lipcli.importing.api import run

    report = run(checkpoint, source, out, arch=arch, overwrite=overwrite, compare=compare, radii=radii,
                 dataset=dataset, data_dir=data_dir, download=download, limit=limit, config=config,
                 options=tuple(option or ()), verify=verify, verify_tolerance=verify_tolerance)
    lines = [] if json_out else report_lines(report)
    if report.compare is not None and not json_out:
        lines += comparison_lines(report.compare)
    for line in lines:
        typer.echo(clean(line))
    if json_out:
        print_json(report.to_json())


def report_lines(report: Any) -> list[str]:
    """An :class:`~lipcli.importing.ImportReport` for people."""
    bound = report.lipschitz_upper_bound
    lines = [f"wrote {report.out}: {report.description or report.importer} from {report.source}",
             f"checkpoint {report.checkpoint} ({report.format}, sha256 {report.sha256})",
             "GUARANTEED Lipschitz bound of the features: "
             + ("none (see `lip lipschitz`)" if bound is None else f"{bound:.8g}")]
    if report.options:
        lines.append("source options: " + ", ".join(f"{k}={v}" for k, v in report.options.items()))
    if report.verify is not None:
        v = report.verify
        lines.append(f"verified against {v.file}: {v.points} inputs, logits within {v.max_abs_error:.3g} "
                     f"({v.relative_error:.3g} of max(1, |logit|); tolerance {v.tolerance:g})")
    if report.ignored:
        lines.append(f"not imported (estimator state lipcli does not use): {len(report.ignored)} tensors")
    return lines


def comparison_lines(cmp: Any) -> list[str]:
    """``--compare``: one row per radius."""
    src = ("the source's rule: not reproduced" if cmp.source_lipschitz is None
           else f"the source by {cmp.source_lipschitz:.8g} ({cmp.source_label}, NOT guaranteed)")
    lines = [f"compare on {cmp.points} points (clean accuracy {cmp.clean_accuracy:.4f}): lipcli divides "
             f"by the GUARANTEED bound {cmp.lipcli_lipschitz:.8g} over all classes; {src}",
             "radius   source rule   lipcli   certified by the source only"]
    for row in cmp.rows:
        theirs = "-" if row.source_certified_accuracy is None else f"{row.source_certified_accuracy:.4f}"
        only = "-" if row.source_only is None else str(row.source_only)
        lines.append(f"{row.radius_units:>6g}   {theirs:>11}   {row.lipcli_certified_accuracy:.4f}   {only}")
    if cmp.note:
        lines.append(f"note: {cmp.note}")
    return lines
