"""``lipcli.import_checkpoint(...)``: the Python twin of ``lip import``: a checkpoint saved by
another project's code as a lipcli model file, optionally compared (``compare=True``) with
the source's own certificate rule; returns the :class:`~lipcli.importing.driver.ImportReport`
that ``lip import --json`` prints."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["run"]


def run(checkpoint: str | os.PathLike, source: str, out: str | os.PathLike, *, arch: str | None = None,
        overwrite: bool = False, compare: bool = False, radii: str = "36,72,108", dataset: str | None = None,
        data_dir: str | os.PathLike | None = None, download: bool | None = None,
        limit: int | None = None, config: str | os.PathLike | None = None, options: tuple[str, ...] = (),
        verify: str | os.PathLike | None = None, verify_tolerance: float | None = None) -> Any:
    """Import ``checkpoint`` with the importer ``source`` into ``out`` (``config``/``options``:
    the source's own configuration, ``NAME=VALUE`` items; ``verify``: an ``.npz`` of inputs and
    the source's logits the imported model must reproduce within ``verify_tolerance``)."""
    from pathlib import Path

    from lipcli.certify.options import CertifyOptions, parse_radii
    from lipcli.data.roots import for_certification
    from lipcli.importing.driver import compare_imported, import_checkpoint

    radii_list = parse_radii(radii) if compare else []
    certify: list[Any] = []  # the comparison's certification settings
    data: list[Any] = []

    def check_data(record: Any) -> None:  # compare: its data read (once) before the file is written
        from lipcli.host.plugins import get_registry
        from lipcli.importing.compare import check_compare_data

        named = dataset or (record or {}).get("name")
        root, fetch = for_certification(Path(out), named, None if data_dir is None else Path(data_dir), download)
        certify.append(CertifyOptions(radii=radii_list, dataset=dataset, data_dir=root, download=fetch, limit=limit,
                                      write=False))  # the model file is written once, by the import
        data.append(check_compare_data(certify[0], record, Path(out), get_registry()))

    tolerance = {} if verify_tolerance is None else {"verify_tolerance": verify_tolerance}
    report = import_checkpoint(checkpoint, source, out, arch=arch, overwrite=overwrite, config=config,
                               options=tuple(options), verify=verify, before_write=check_data if compare else None,
                               **tolerance)
    if compare:
        compare_imported(report, certify[0], data=data[0])
    return report
