"""What :func:`lipcli.export.export_model` does: :class:`ExportOptions`, its defaults written
once here (read by ``lip export`` and its ``--help``; no torch import)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExportOptions:
    """What :func:`~lipcli.export.driver.export_model` does (the CLI's options)."""

    format: str | None = None  # None: from the output's suffix, else pt2
    out: str | None = None
    certify: bool = False
    #: inputs on which the written program is compared with lipcli
    check_inputs: int = 64
    overwrite: bool = False
    seed: int = 0
