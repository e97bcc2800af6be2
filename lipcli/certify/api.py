"""``lipcli.certify(...)``: the Python twin of ``lip certify``.

The same settings (every :class:`~lipcli.certify.options.CertifyOptions` setting as a keyword
argument; ``radii`` as the command line writes them, ``"36,72,108"``, or a list of absolute
radii), the same default data root and model-file write-back, and the same typed result,
:class:`~lipcli.certify.results.CertifySummary`, that ``lip certify --json`` prints::

    import lipcli
    summary = lipcli.certify("runs/m.safetensors", radii="36,72,108", attack=True)
    [row.certified_accuracy for row in summary.radii]

``lip certify`` is a thin layer over :func:`prepare` and :func:`run_certification`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

__all__ = ["prepare", "run"]


def prepare(model: str | os.PathLike | None = None, *, radii: str | list[float] | None = None,
            write: bool = True, **settings: Any) -> tuple[Path, Any, str | None]:
    """``(model file, options, default data root)`` for these arguments (``model`` None: the
    most recent model under ./runs), every setting checked (one-line :class:`SettingError`)."""
    import dataclasses

    from lipcli.certify.options import DEFAULT_RADII, CertifyOptions, parse_radii
    from lipcli.data.roots import for_certification
    from lipcli.host.runs import resolve_model_argument

    unit = settings.get("radius_unit", CertifyOptions.radius_unit)
    radii_list = parse_radii(DEFAULT_RADII if radii is None else radii, unit) if not isinstance(radii, list) \
        else sorted(set(float(r) for r in radii))
    path = resolve_model_argument(None if model is None else Path(model))
    data_dir = settings.pop("data_dir", None)
    root, download = for_certification(path, settings.get("dataset"), None if data_dir is None else Path(data_dir),
                                       settings.pop("download", None))
    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(CertifyOptions)})
    if unknown:
        from lipcli.sdk.errors import LipUsageError

        raise LipUsageError(f"unknown certify setting {unknown[0]!r}")
    options = dataclasses.replace(CertifyOptions(), radii=radii_list, data_dir=root, download=download,
                                  write=write, **settings)
    options.check()
    return path, options, root if data_dir is None else None


def run(model: str | os.PathLike | None = None, *, progress: Callable[..., Any] | None = None,
        **arguments: Any) -> Any:
    """Certify (the arguments of :func:`prepare`); returns the :class:`CertifySummary`."""
    from lipcli.certify.driver import run_certification

    path, options, _root = prepare(model, **arguments)
    return run_certification(path, options, progress=progress).summary
