"""The default data root of ``lip train`` and ``lip certify``: a CIFAR data set named without
``--data-dir`` lives in :func:`lipcli.data.loaders.default_data_root` (``$LIPCLI_DATA``, else the
user cache folder + ``lipcli/data``), is downloaded there when missing (unless
``--no-download``), and the folder used is printed on stderr.  With ``--data-dir`` nothing is
downloaded unless ``--download`` is given."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import typer


def _name(choice: Any) -> str | None:
    return choice.split(":", 1)[0].strip() if isinstance(choice, str) else None


def announce(root: Path, quiet: bool) -> None:
    """``data: ROOT ...`` on stderr (not with ``--quiet``, nor in a worker process of a
    multi-process run: the launching process or rank 0 says it)."""
    from lipcli.cli.common import other_rank
    from lipcli.data.loaders import DATA_ENV
    from lipcli.train.config import LAUNCH_ERRORS_ENV

    if quiet or other_rank() or os.environ.get(LAUNCH_ERRORS_ENV):
        return
    typer.echo(f"data: {root} (the default data root; set {DATA_ENV} or pass --data-dir to use "
               "another)", err=True)


def for_training(cfg: Any, download_given: bool, quiet: bool) -> Any:
    """``cfg`` (a TrainConfig of a new run) with the default data root filled in when its
    data set is a downloadable one and no directory was given; ``download`` becomes true
    there unless ``--download/--no-download`` was given."""
    from lipcli.data.loaders import DOWNLOADABLE, default_data_root

    if cfg.data_dir is not None or _name(cfg.dataset) not in DOWNLOADABLE:
        return cfg
    root = default_data_root()
    announce(root, quiet)
    return dataclasses.replace(cfg, data_dir=str(root), download=cfg.download if download_given else True)


def for_certification(model: Path, dataset: str | None, data_dir: Path | None, download: bool | None,
                      quiet: bool) -> tuple[str | None, bool]:
    """``(data_dir, download)`` for ``lip certify``: the default data root when the data set
    (``--dataset``, else the model file's) is a downloadable one, no ``--data-dir`` was given
    and (for the recorded data set) the recorded folder does not exist here."""
    from lipcli.data.loaders import DOWNLOADABLE, default_data_root

    if data_dir is not None:
        return str(data_dir), bool(download)
    if dataset is None:
        from lipcli.host.modelfile import read_metadata
        from lipcli.sdk.errors import LipError

        try:
            recorded = read_metadata(model).get("dataset")
        except LipError:  # reported by the loader
            return None, bool(download)
        if not isinstance(recorded, dict) or _name(recorded.get("name")) not in DOWNLOADABLE:
            return None, bool(download)
        root = recorded.get("root")
        if isinstance(root, str) and os.path.isdir(os.path.expanduser(root)):
            return None, bool(download)  # the recorded folder, as before
    elif _name(dataset) not in DOWNLOADABLE:
        return None, bool(download)
    root = default_data_root()
    announce(root, quiet)
    return str(root), download is not False
