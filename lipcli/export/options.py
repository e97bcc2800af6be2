"""What :func:`lipcli.export.export_model` does: :class:`ExportOptions`, its defaults written
once here (read by ``lip export`` and its ``--help``; no torch import)."""

from __future__ import annotations

from dataclasses import dataclass

from lipcli.host.settings import setting
from lipcli.lowering.caps import EXPORT_DENSE_MAX_MIB, dense_max_bytes
from lipcli.sdk.lowering_costs import DENSE_MIN_GAIN

#: ``lip export --dense-max-mib``'s default, :data:`lipcli.lowering.caps.EXPORT_DENSE_MAX_MIB`
#: (also read as ``lipcli.export.DENSE_MAX_MIB``)
DENSE_MAX_MIB = EXPORT_DENSE_MAX_MIB
#: the most check inputs (``--check``; their bytes are bounded too: lipcli.export.driver)
MAX_CHECK_INPUTS = 100_000


@dataclass
class ExportOptions:
    """What :func:`~lipcli.export.driver.export_model` does (the CLI's options)."""

    format: str | None = setting(None, "pt2 (torch.export, torch alone), torchscript (torch alone) or onnx "
                                 "(onnxruntime alone; needs pip install 'lipcli\\[onnx]'). Default: from "
                                 "--output's suffix (.pt2, .torchscript.pt, .onnx), else pt2.", owner="export",
                                 flags=("--format", "-f"), choices=("pt2", "torchscript", "onnx"))
    out: str | None = setting(None, "File to write (default: MODEL with the suffix .pt2, .torchscript.pt or "
                              ".onnx).", owner="export", flags=("--output", "-o"))
    certify: bool = setting(False, "The program also returns the certified input-space l2 radius of each "
                            "prediction (LLN: exact; CRC-Lip: closed form with guaranteed curvature bounds).",
                            owner="export")
    #: inputs on which the written program is compared with lipcli
    check_inputs: int = setting(64, "Inputs on which the written program is compared with lipcli (test images "
                                "of the model's data set when available offline, else random images).",
                                owner="export", flags=("--check",), min=1, max=MAX_CHECK_INPUTS)
    overwrite: bool = setting(False, "Replace an existing output file.", owner="export")
    seed: int = 0
    #: largest dense operator matrix per layer, MiB of float32 (0: every layer literal;
    #: :mod:`lipcli.lowering.caps`)
    dense_max_mib: float = setting(EXPORT_DENSE_MAX_MIB, "Largest dense matrix per layer, MiB of float32: a "
                                   "layer whose fixed linear map on the program's input size fits runs as that "
                                   "matrix (formed exactly in float64) when it is at least "
                                   f"{DENSE_MIN_GAIN:g}x cheaper per input than the layer's literal form (the "
                                   "bound covers it); 0: every layer literal (SOC: its series of convolutions).",
                                   owner="export", min=0.0)

    @property
    def dense_max_bytes(self) -> int:
        return dense_max_bytes(self.dense_max_mib)
