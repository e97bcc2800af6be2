"""``cifar10`` / ``cifar100``: the "python version" archives of
https://www.cs.toronto.edu/~kriz/cifar.html as torchvision stores them:
``DIR/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}`` and
``DIR/cifar-100-python/{train, test, meta}``. ``download=True`` (``lip train --download``) lets
torchvision fetch and verify the archive into ``DIR``; otherwise nothing is downloaded and a
missing file is an error naming the expected layout. The files are Python pickles; they are
read with a restricted unpickler that only rebuilds dicts, lists, strings, numbers and numpy
arrays, so a tampered file cannot run code. Normalisation: mean (0.4914, 0.4822, 0.4465), std
0.2507 for every channel (the paper's constants, used for CIFAR-100 too).
"""

from __future__ import annotations

import contextlib
import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from lipcli._util.outputs import cannot_create_in
from lipcli.builtins.datasets.common import RandomCropFlip, TensorImageDataset, check_split
from lipcli.sdk.errors import LipError, LipUsageError, NamedSettings, SettingError, literal

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = ("test_batch",)
CIFAR10_META = "batches.meta"
CIFAR100_DIR = "cifar-100-python"
CIFAR100_TRAIN = ("train",)
CIFAR100_TEST = ("test",)
CIFAR100_META = "meta"



class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler for the CIFAR batches: only numpy arrays and plain containers.

    The CIFAR "python version" files are pickled dicts of numpy arrays, lists and strings.
    Anything else (a global that could run code) is refused.
    """

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),
        ("collections", "OrderedDict"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        if module.startswith("numpy.core."):  # numpy >= 2 moved numpy.core to numpy._core
            try:
                return super().find_class("numpy._core." + module[len("numpy.core."):], name)
            except (ImportError, AttributeError):
                pass
        return super().find_class(module, name)


def _load_pickle(path: Path) -> dict[str, Any]:
    """Read one CIFAR pickle (Python 2 or 3) as a dict with ``str`` keys."""
    try:
        raw = path.read_bytes()
        obj = _RestrictedUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except OSError as exc:
        raise LipUsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise LipUsageError(f"{path} is not a CIFAR python batch file ({exc})") from None
    if not isinstance(obj, dict):
        raise LipUsageError(f"{path} is not a CIFAR python batch file (not a dict)")
    return {(k.decode("latin1") if isinstance(k, bytes) else str(k)): v for k, v in obj.items()}


def _names(values: Any) -> list[str]:
    return [v.decode("latin1") if isinstance(v, bytes) else str(v) for v in values]


def _cifar_layout(variant: str, root: Path) -> tuple[Path, tuple[str, ...], tuple[str, ...], str]:
    if variant == "cifar10":
        return root / CIFAR10_DIR, CIFAR10_TRAIN, CIFAR10_TEST, CIFAR10_META
    return root / CIFAR100_DIR, CIFAR100_TRAIN, CIFAR100_TEST, CIFAR100_META


def _layout_hint(variant: str, root: Path) -> str:
    base, train, test, meta = _cifar_layout(variant, root)
    listed = ", ".join((*train, *test, meta)) if variant == "cifar100" else (
        "data_batch_1..data_batch_5, test_batch, batches.meta"
    )
    return f"{base}/{{{listed}}}"


class DownloadError(NamedSettings, LipError):
    """A CIFAR archive could not be downloaded (offline, a bad checksum, ...): runtime error
    (exit 1) naming the folder to fill by hand and the embedded alternative, whose setting
    (``{dataset}``) a front end spells as its option (:class:`~lipcli.sdk.errors.NamedSettings`).
    ``root_note`` (e.g. ``"LIPCLI_DATA; "``, set by a front end) says where the folder's name
    came from, at the start of the parenthesis after it (the template's ``{root_note}`` field)."""

    def __init__(self, template: str) -> None:
        self.root_note = ""
        super().__init__(self._init_template(template))

    def library_label(self, name: str) -> str:  # type: ignore[override]
        return self.root_note if name == "root_note" else name

    def render(self, label: Any) -> str:
        return super().render(lambda name: self.root_note if name == "root_note" else label(name))


def _damaged_archive(variant: str, root: Path) -> str | None:
    """The published archive's file name when a file of that name in ``root`` is not it
    (its MD5 differs), else None."""
    import torchvision
    from torchvision.datasets.utils import check_integrity

    cls = torchvision.datasets.CIFAR10 if variant == "cifar10" else torchvision.datasets.CIFAR100
    archive = root / cls.filename
    return cls.filename if archive.is_file() and not check_integrity(str(archive), cls.tgz_md5) else None


def _download_cifar(variant: str, root: Path) -> None:
    """Download the published archive into ``root`` and unpack it there (torchvision's
    downloader: a progress bar on stderr, the published MD5 checked before unpacking; the
    archive is removed afterwards).  Nothing is unpickled here."""
    import torchvision
    from torchvision.datasets.utils import download_and_extract_archive

    cls = torchvision.datasets.CIFAR10 if variant == "cifar10" else torchvision.datasets.CIFAR100
    damaged = _damaged_archive(variant, root)
    created = not root.exists()
    try:
        root.mkdir(parents=True, exist_ok=True)
        download_and_extract_archive(cls.url, str(root), filename=cls.filename, md5=cls.tgz_md5,
                                     remove_finished=True)
    except Exception as exc:  # noqa: BLE001 - network errors of every kind: runtime (exit 1)
        if created:  # the folder made for the download, when nothing came into it
            with contextlib.suppress(OSError):
                root.rmdir()
        reason = " ".join(str(getattr(exc, "reason", None) or exc or type(exc).__name__).split())
        if isinstance(exc, RuntimeError) and "corrupted" in reason:
            reason = "the download does not match the published MD5 checksum"
        elif damaged is not None:  # the file there was not the archive, and none came
            reason += f"; the {damaged} found there is damaged (not the published MD5 checksum): delete it"
        folder = CIFAR10_DIR if variant == "cifar10" else CIFAR100_DIR

        raise DownloadError(
            f"could not download {variant} into {literal(root)} ({{root_note}}{literal(reason)}); offline, put the folder "
            f"{folder} (the 'python version' of https://www.cs.toronto.edu/~kriz/cifar.html) in "
            f"{literal(root)}, or use the embedded data set: {{dataset}} digits"
        ) from None


def load_cifar(
    variant: str, root: str | Path | None, split: str, *, download: bool = False, augment: bool = False
) -> TensorImageDataset:
    """CIFAR-10 (``variant="cifar10"``) or CIFAR-100 (``"cifar100"``, fine labels)."""
    check_split(variant, split)
    title = "CIFAR-10" if variant == "cifar10" else "CIFAR-100"
    if root is None:
        raise SettingError("data_dir", f"{title} needs a data directory")
    root = Path(root).expanduser()
    base, train_files, test_files, meta_file = _cifar_layout(variant, root)
    files = train_files if split == "train" else test_files
    needed = [base / f for f in (*files, meta_file)]
    if download and not all(p.is_file() for p in needed):
        reason = cannot_create_in(root) if root.is_dir() else None
        if reason is not None:
            raise SettingError("data_dir", f"data directory {root} has no {title} and cannot take the "
                                           f"download: {reason}")
        _download_cifar(variant, root)
    missing = [p for p in needed if not p.is_file()]
    if missing:
        archive = _damaged_archive(variant, root)
        there = "" if archive is None else f"; the {archive} there is damaged (not the published MD5 checksum)"
        raise SettingError(
            "download",
            f"{title} not found in {root} (missing {missing[0]}): expected "
            f"{_layout_hint(variant, root)} (the 'python version'){there}; downloading fetches it"
        )
    num_classes = 10 if variant == "cifar10" else 100
    meta = _load_pickle(base / meta_file)
    name_key = "label_names" if variant == "cifar10" else "fine_label_names"
    if name_key not in meta:
        raise LipUsageError(f"{base / meta_file}: no {name_key!r} entry; not a {title} meta file")
    classes = _names(meta[name_key])
    if len(classes) != num_classes:
        raise LipUsageError(f"{base / meta_file}: {len(classes)} class names, expected {num_classes}")

    import numpy as np

    chunks, labels = [], []
    label_key = "labels" if variant == "cifar10" else "fine_labels"
    for name in files:
        path = base / name
        entry = _load_pickle(path)
        if "data" not in entry or label_key not in entry:
            raise LipUsageError(f"{path}: no 'data'/{label_key!r} entries; not a {title} batch")
        data = np.asarray(entry["data"])
        lab = np.asarray(entry[label_key], dtype=np.int64).reshape(-1)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise LipUsageError(
                f"{path}: 'data' must be uint8 of shape (N, 3072), got {data.dtype} {data.shape}"
            )
        if lab.shape[0] != data.shape[0]:
            raise LipUsageError(f"{path}: {data.shape[0]} images but {lab.shape[0]} labels")
        if lab.size and (lab.min() < 0 or lab.max() >= num_classes):
            raise LipUsageError(f"{path}: labels outside 0..{num_classes - 1}")
        chunks.append(data)
        labels.append(lab)
    images = torch.from_numpy(np.concatenate(chunks).reshape(-1, 3, 32, 32).copy())
    targets = torch.from_numpy(np.concatenate(labels))
    transform = RandomCropFlip(flip=True) if augment else None
    return TensorImageDataset(images, targets, classes, transform)


def _cifar10_factory(root: Any, split: str, *, download: bool = False, augment: bool = False) -> Dataset:
    return load_cifar("cifar10", root, split, download=download, augment=augment)


def _cifar100_factory(root: Any, split: str, *, download: bool = False, augment: bool = False) -> Dataset:
    return load_cifar("cifar100", root, split, download=download, augment=augment)
