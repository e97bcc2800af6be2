"""The evaluation data of a certification run: which data set (the one named, else the one
the model file records), resolved by the host's one resolver (:mod:`lipcli.data.loaders`), and
its agreement with the model (classes, class names, input shape, labels)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from lipcli.certify.results import EvalDataset
from lipcli.data.loaders import check_data_dir, data_loaded, resolve_dataset
from lipcli.sdk.errors import LipError, LipUsageError, SettingError
from lipcli.host.models import recorded_dataset
from lipcli.host.registry import Registry


def _shorten(names: list[str], keep: int = 5) -> str:
    shown = ", ".join(str(n) for n in names[:keep])
    return shown + (f", ... ({len(names)} in all)" if len(names) > keep else "")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def check_class_names(
    recorded: Any, dataset: Any, info: EvalDataset, model_path: Any, ignore: bool
) -> str | None:
    """Refuse (:class:`SettingError` ``ignore_class_names``) a data set whose class names
    differ from the ones the model file records (same count, different data: accuracy would
    be meaningless), unless ``ignore``; then return a note.  Nothing is checked when either
    side has no names."""
    want = recorded.get("classes") if isinstance(recorded, dict) else None
    have = getattr(dataset, "classes", None)
    if not isinstance(want, list) or have is None:
        return None
    want = [str(c) for c in want]
    try:
        have = [str(c) for c in have]
    except TypeError:
        return None
    if want == have:
        return None
    text = (
        f"data set {info.name!r} has classes [{_shorten(have)}] but {model_path} was trained "
        f"on classes [{_shorten(want)}]"
    )
    if not ignore:
        raise SettingError(
            "ignore_class_names", text + "; ignore the class names to certify on this data anyway"
        )
    return text + " (--ignore-class-names)"


def load_dataset(
    registry: Registry,
    recorded: dict[str, Any] | None,
    *,
    name: str | None,
    data_dir: str | None,
    download: bool,
    split: str,
    model_path: str | os.PathLike,
) -> tuple[Any, EvalDataset]:
    """The evaluation data set: ``name`` (``NAME[:key=value,...]``) or, when ``None``, the
    model file's recorded ``dataset`` slot (its root too, unless ``data_dir`` is given)."""
    if name is None:
        if not isinstance(recorded, dict) or not isinstance(recorded.get("name"), str):
            raise SettingError("dataset", f"{model_path} records no data set; name one (and its directory)")

        # a defective or unknown recorded data set is a defect of the file (exit 1, names it)
        comp = recorded_dataset(model_path, recorded, registry)
    else:
        comp = resolve_dataset(name, registry)
    spec = comp.spec
    root = data_dir
    if root is None and name is None and isinstance(recorded, dict):
        root = recorded.get("root")
    root = check_data_dir(comp, root, download)
    try:
        dataset = comp.build(root, split, download=download, augment=False)
    except LipError:
        raise
    except (FileNotFoundError, NotADirectoryError, KeyError, ValueError) as exc:
        raise LipUsageError(
            f"cannot load data set {spec.name!r} split {split!r} from {root}: {_one_line(exc)}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - foreign data set code
        raise LipError(
            f"cannot load data set {spec.name!r} split {split!r} from {root}: {_one_line(exc)}"
        ) from None
    data_loaded(root)
    num_classes = spec.num_classes
    if num_classes is None:
        classes = getattr(dataset, "classes", None)
        num_classes = len(classes) if classes is not None else None
    info = EvalDataset(
        name=spec.name, params=dict(comp.params), split=split,
        root=None if root is None else str(root), num_classes=num_classes,
    )
    return dataset, info


def check_compatible(model: nn.Module, dataset: Any, info: EvalDataset, model_path: Any) -> None:
    """Model/data mismatch (classes, input shape) -> :class:`LipUsageError`."""
    config = model.lipcli_config
    want_classes = int(config["num_classes"])
    if info.num_classes is not None and int(info.num_classes) != want_classes:
        raise LipUsageError(
            f"data set {info.name!r} has {info.num_classes} classes but {model_path} "
            f"was built for {want_classes}"
        )
    if len(dataset) == 0:
        raise LipUsageError(f"data set {info.name!r} split {info.split!r} is empty")
    image, _label = dataset[0]
    image = torch.as_tensor(image)
    shape = (int(config["in_channels"]), *map(int, config.get("image_size") or (32, 32)))
    if tuple(image.shape) != shape:
        raise LipUsageError(
            f"data set {info.name!r} gives images of shape {tuple(image.shape)} but "
            f"{model_path} expects {shape}"
        )


def batches(n: int, size: int):
    """``(start, stop)`` of consecutive batches of ``range(n)``."""
    for start in range(0, n, size):
        yield start, min(n, start + size)


def stack(dataset: Any, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (float32) and labels of ``dataset[indices]``."""
    images, labels = [], []
    for i in indices:
        img, lab = dataset[i]
        images.append(torch.as_tensor(img, dtype=torch.float32))
        labels.append(int(lab))
    return torch.stack(images), torch.tensor(labels, dtype=torch.long)


def limit_subset(dataset: Any, n: int, notes: list[str]) -> tuple[Any, list[int] | None]:
    """The ``n`` points to certify: the whole split (indices ``None``), or the seeded,
    class-stratified subset that ``lip train --limit-test n`` evaluates too
    (:func:`lipcli.data.loaders.stratified_indices`; a note says so)."""
    if n >= len(dataset):
        return dataset, None
    from torch.utils.data import Subset

    from lipcli.data.loaders import dataset_labels, stratified_indices

    indices = stratified_indices(dataset_labels(dataset), n)
    notes.append(f"limit {n}: a seeded, class-stratified subset of the split's {len(dataset)} points "
                 "(the same for every model; the one lip train evaluates with the same limit)")
    return Subset(dataset, indices), indices
