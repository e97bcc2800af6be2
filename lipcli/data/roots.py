"""Where a run's data set lives when no directory is given: a downloadable data set (CIFAR)
named without ``data_dir`` uses the default data root (:func:`lipcli.data.loaders.default_data_root`);
the same rule for ``lip train``/``lipcli.train`` and ``lip certify``/``lipcli.certify``."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any


def _name(choice: Any) -> str | None:
    return choice.split(":", 1)[0].strip() if isinstance(choice, str) else None


def for_training(cfg: Any, download_given: bool) -> tuple[Any, str | None]:
    """``(cfg, root)``: ``cfg`` (a TrainConfig of a new run) with the default data root
    ``root`` filled in when its data set is a downloadable one and no directory was given
    (``download`` becomes true there unless ``--download/--no-download`` was given), else
    ``cfg`` as it is and None."""
    from lipcli.data.loaders import DOWNLOADABLE, default_data_root

    if cfg.data_dir is not None or _name(cfg.dataset) not in DOWNLOADABLE:
        return cfg, None
    root = str(default_data_root())
    return dataclasses.replace(cfg, data_dir=root, download=cfg.download if download_given else True), root


def for_certification(model: Path, dataset: str | None, data_dir: Path | None,
                      download: bool | None) -> tuple[str | None, bool]:
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
    return str(default_data_root()), download is not False
