"""``lip export``: deployable programs that keep their certificate.

* the protocol components implement (``export_module()`` or ``export_module(context)``,
  ``export_certificate()``, :class:`~lipcli.sdk.export.ExportError`) is part of the plugin
  SDK: :mod:`lipcli.sdk.export` (the context: :class:`~lipcli.sdk.lowering.LoweringContext`);
  the network is lowered as ``lip certify`` runs it, by :mod:`lipcli.lowering`;
* :mod:`lipcli.export.program`: the exported network (``x -> logits`` or
  ``x -> (logits, radius)``);
* :mod:`lipcli.export.formats`: ``pt2`` (torch.export), ``torchscript``, ``onnx``;
* :mod:`lipcli.export.driver`: :func:`export_model` (write, load back, compare);
* :mod:`lipcli.export.options`: :class:`ExportOptions` (its defaults, without torch).
"""

from __future__ import annotations

from lipcli._util.lazy import lazy_exports

#: public name -> submodule defining it (imported on first use: ``lip export --help`` reads
#: :class:`ExportOptions` from :mod:`lipcli.export.options` without torch)
_EXPORTS: dict[str, str] = {
    "ExportCheck": "driver", "ExportCheckError": "driver", "ExportReport": "driver",
    "export_model": "driver", "ExportOptions": "options", "FORMATS": "formats",
    "MissingRuntimeError": "formats", "DENSE_MAX_MIB": "options",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)  # the names above, listed once
