"""``lip export``: deployable programs that keep their certificate.

* :mod:`lipcli.export.lowering`: the protocol components implement (``export_module()``,
  ``export_certificate()``) and :class:`ExportError`;
* :mod:`lipcli.export.program`: the exported network (``x -> logits`` or
  ``x -> (logits, radius)``);
* :mod:`lipcli.export.formats`: ``pt2`` (torch.export), ``torchscript``, ``onnx``;
* :mod:`lipcli.export.driver`: :func:`export_model` (write, load back, compare).
"""

from __future__ import annotations

from lipcli.export.driver import ExportCheck, ExportCheckError, ExportOptions, ExportReport, export_model
from lipcli.export.formats import FORMATS, MissingRuntimeError
from lipcli.export.lowering import ExportedCertificate, ExportError, lower_module

__all__ = [
    "ExportCheck", "ExportCheckError", "ExportError", "ExportOptions", "ExportReport",
    "ExportedCertificate", "FORMATS", "MissingRuntimeError", "export_model", "lower_module",
]
