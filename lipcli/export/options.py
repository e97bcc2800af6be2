"""What :func:`lipcli.export.export_model` does: :class:`ExportOptions`, its defaults written
once here (read by ``lip export`` and its ``--help``; no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

#: default largest matrix (MiB of float32) a linear layer may materialise as its exported
#: operator (``lip export --dense-max-mib``, see :class:`lipcli.sdk.export.ExportContext`);
#: 0 keeps every layer in its literal form
DENSE_MAX_MIB = 32.0


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
    #: largest dense operator matrix per layer, MiB of float32 (0: every layer literal)
    dense_max_mib: float = DENSE_MAX_MIB

    @property
    def dense_max_bytes(self) -> int:
        return int(self.dense_max_mib * 2**20)
