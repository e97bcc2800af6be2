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
        limit: int | None = None) -> Any:
    """Import ``checkpoint`` with the importer ``source`` into ``out``."""
    from pathlib import Path

    from lipcli.certify.options import CertifyOptions, parse_radii
    from lipcli.data.roots import for_certification
    from lipcli.importing.driver import compare_imported, import_checkpoint

    radii_list = parse_radii(radii) if compare else []
    options: list[Any] = []

    def check_data(record: Any) -> None:  # compare: its data read before the file is written
        from lipcli.host.plugins import get_registry
        from lipcli.importing.compare import check_compare_data

        named = dataset or (record or {}).get("name")
        root, fetch = for_certification(Path(out), named, None if data_dir is None else Path(data_dir), download)
        options.append(CertifyOptions(radii=radii_list, dataset=dataset, data_dir=root, download=fetch, limit=limit))
        check_compare_data(options[0], record, Path(out), get_registry())

    report = import_checkpoint(checkpoint, source, out, arch=arch, overwrite=overwrite,
                               before_write=check_data if compare else None)
    if compare:
        compare_imported(report, options[0])
    return report
