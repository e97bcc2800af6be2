"""What :func:`lipcli.export.export_model` does: :class:`ExportOptions`, its defaults written
once here (read by ``lip export`` and its ``--help``; no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from lipcli.lowering.caps import EXPORT_DENSE_MAX_MIB, dense_max_bytes

#: ``lip export --dense-max-mib``'s default, :data:`lipcli.lowering.caps.EXPORT_DENSE_MAX_MIB`
#: (also read as ``lipcli.export.DENSE_MAX_MIB``)
DENSE_MAX_MIB = EXPORT_DENSE_MAX_MIB


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
    #: largest dense operator matrix per layer, MiB of float32 (0: every layer literal;
    #: :mod:`lipcli.lowering.caps`)
    dense_max_mib: float = EXPORT_DENSE_MAX_MIB

    @property
    def dense_max_bytes(self) -> int:
        return dense_max_bytes(self.dense_max_mib)
