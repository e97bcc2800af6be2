"""``lip export``: deployable programs that keep their certificate.

* :mod:`lipcli.export.lowering`: the protocol components implement (``export_module()`` or
  ``export_module(context)``, ``export_certificate()``), :class:`ExportContext` and
  :class:`ExportError`;
* :mod:`lipcli.export.program`: the exported network (``x -> logits`` or
  ``x -> (logits, radius)``);
* :mod:`lipcli.export.formats`: ``pt2`` (torch.export), ``torchscript``, ``onnx``;
* :mod:`lipcli.export.driver`: :func:`export_model` (write, load back, compare);
* :mod:`lipcli.export.options`: :class:`ExportOptions` (its defaults, without torch).
"""

from __future__ import annotations

from lipcli.host.lazy import lazy_exports

#: public name -> submodule defining it (imported on first use: ``lip export --help`` reads
#: :class:`ExportOptions` from :mod:`lipcli.export.options` without torch)
_EXPORTS: dict[str, str] = {
    "ExportCheck": "driver", "ExportCheckError": "driver", "ExportReport": "driver",
    "export_model": "driver", "ExportOptions": "options", "FORMATS": "formats",
    "MissingRuntimeError": "formats", "ExportedCertificate": "lowering", "ExportError": "lowering",
    "lower_module": "lowering", "ExportContext": "lowering", "DENSE_MAX_MIB": "options",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "DENSE_MAX_MIB", "ExportCheck", "ExportCheckError", "ExportContext", "ExportError",
    "ExportOptions", "ExportReport",
    "ExportedCertificate", "FORMATS", "MissingRuntimeError", "export_model", "lower_module",
]
