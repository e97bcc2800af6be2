"""Command-line options shared by every ``lip`` command, each defined once (``Annotated``
aliases): ``--device``, ``--json``, ``--quiet``, ``--threads`` (every command that computes)
and the optional MODEL argument; and the data-set options that ``lip train`` and ``lip
certify`` share (``--data-dir``, ``--download``).

Their defaults are the library's (:data:`lipcli._util.devices.DEFAULT_DEVICE`, a command's
options dataclass), written where a command declares the parameter, e.g.
``device: DeviceOption = CertifyOptions.device``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

#: help of the optional MODEL argument (lip certify, lipschitz, info, export)
MODEL_HELP = "Model file (.safetensors); default: the most recent one under ./runs (or $LIPCLI_RUNS)."

ModelArgument = Annotated[Optional[Path], typer.Argument(help=MODEL_HELP, show_default=False)]
DeviceOption = Annotated[str, typer.Option("--device", help="Device: auto (CUDA if available), cpu, cuda or cuda:N.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout (strict JSON).")]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress output on stderr.")]
CompileModeOption = Annotated[str, typer.Option("--compile-mode", help="torch.compile mode with --compile: default, "
                                              "reduce-overhead or max-autotune.")]
DataDirOption = Annotated[Optional[Path], typer.Option("--data-dir", help="Data set root directory (cifar10: "
                                                       "DIR/cifar-10-batches-py/...; imagefolder: DIR/train, DIR/test).")]
DownloadOption = Annotated[Optional[bool], typer.Option(
    "--download/--no-download", show_default=False, help="Download a missing CIFAR-10/100 (the published "
    "archive; torchvision checks its MD5). Default: only into the default data root, used when "
    "--data-dir is not given ($LIPCLI_DATA, else the user cache folder + lipcli/data); --download: "
    "also into --data-dir; --no-download: never.")]


def _apply_threads(value: Optional[int]) -> Optional[int]:
    # click calls this while parsing, given or not: the thread count is set at process start
    from lipcli.cli.common import apply_threads

    apply_threads(value)
    return value


THREADS_HELP = ("CPU threads for torch. Default: torch's own (the usable cores, or OMP_NUM_THREADS); "
                "OMP_WAIT_POLICY=PASSIVE unless set: with OpenMP's default busy waiting, "
                "`lip certify --attack` ran 6-8x slower on a loaded 2-core machine (docs/guide.md).")
ThreadsOption = Annotated[Optional[int], typer.Option(
    "--threads", min=1, metavar="N", callback=_apply_threads, show_default=False, help=THREADS_HELP)]
