"""``lip import``: a checkpoint saved by another project's code -> a lipcli model file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from lipcli.cli.common import cli_errors, print_json, stdout_console
from lipcli.cli.options import JsonOption, ThreadsOption


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
    from lipcli.importing import import_checkpoint

    report = import_checkpoint(checkpoint, source, out, arch=arch, overwrite=overwrite)
    if json_out:
        print_json(report.to_json())
    else:
        print_report(report)


def print_report(report: Any) -> None:
    """An :class:`~lipcli.importing.ImportReport` for people (stdout)."""
    console = stdout_console()
    say = lambda text: console.print(text, soft_wrap=True, highlight=False)  # noqa: E731
    bound = report.lipschitz_upper_bound
    say(f"wrote {report.out}: {report.description or report.importer} from {report.source}")
    say(f"checkpoint {report.checkpoint} ({report.format}, sha256 {report.sha256})")
    say("GUARANTEED Lipschitz bound of the features: "
        + ("none (see `lip lipschitz`)" if bound is None else f"{bound:.8g}"))
    if report.ignored:
        say(f"not imported (estimator state lipcli does not use): {len(report.ignored)} tensors")
