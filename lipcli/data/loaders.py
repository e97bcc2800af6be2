"""Data for training and evaluation: data set resolution, subsets, splits, loaders, samplers.

The data sets themselves come from ``lip_datasets`` plugins (:mod:`lipcli.builtins.datasets`
for the built-ins); this module turns a choice such as ``"imagefolder:stats=data"`` plus a
directory into a :class:`DataBundle`: an augmented training set, an optional validation set
held out of the training split (never the test set: model selection must not see it), the
test set, the class names and the normalisation constants for the model's input layer.

Reproducibility (used by ``lip train --resume``):

* the training subset (``limit_train``) and the validation split are seeded permutations of
  the indices, so the same seed always selects the same images; the test subset
  (``limit_test``, and ``lip certify --limit``) is class-stratified with a constant seed
  (:func:`stratified_indices`): the same images for every run and model;
* the training order comes from a :class:`~torch.utils.data.DistributedSampler` for every
  run (one process is ``num_replicas=1``), reshuffled per epoch from ``seed + epoch``;
* augmentation randomness is made a function of ``(seed, epoch, rank)`` by
  :func:`epoch_seed`, which the training driver feeds to ``torch.manual_seed`` and to the
  loader's generator (which seeds worker processes) at the start of every epoch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from lipcli.sdk.errors import LipUsageError, SettingError
from lipcli.host.plugins import Registry, get_registry
from lipcli.sdk.specs import Component, DatasetSpec
from lipcli.data.augmentation import apply_augmentation


@dataclass
class DataBundle:
    """Everything the driver needs about the data of one run."""

    component: Component
    root: str | None
    train: Dataset
    test: Dataset
    val: Dataset | None
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    image_shape: tuple[int, int, int]
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def spec(self) -> DatasetSpec:
        return self.component.spec  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def info(self) -> dict[str, Any]:
        """The ``dataset`` record of a model file (JSON)."""
        return {
            "name": self.component.name,
            "params": dict(self.component.params),
            "provider": self.component.provider,
            "distribution": self.component.distribution,
            "root": self.root,
            "num_classes": self.num_classes,
            "classes": list(self.classes),
            "image_shape": list(self.image_shape),
            "mean": list(self.mean),
            "std": list(self.std),
            "sizes": dict(self.sizes),
        }


def seeded_permutation(n: int, seed: int, salt: str) -> torch.Tensor:
    """A permutation of ``range(n)`` that depends only on ``(seed, salt)``."""
    digest = hashlib.sha256(f"{seed}:{salt}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return torch.randperm(n, generator=gen)


def epoch_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """The seed of epoch ``epoch`` on process ``rank`` (63-bit, independent of everything else)."""
    digest = hashlib.sha256(f"lipcli-epoch:{seed}:{epoch}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def limit_indices(n: int, limit: int | None, seed: int, salt: str) -> list[int]:
    """``limit`` indices out of ``range(n)`` chosen by a seeded permutation (sorted)."""
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(seeded_permutation(n, seed, salt)[:limit].tolist())


#: the seed of the evaluation subsets (``lip train --limit-test``, ``lip certify --limit``): a
#: constant, so that every model and every run is evaluated on the same images
EVAL_SUBSET_SEED = 0


def stratified_indices(labels: Sequence[int], limit: int | None, seed: int = EVAL_SUBSET_SEED,
                       salt: str = "limit-test") -> list[int]:
    """``limit`` indices out of ``range(len(labels))`` (sorted), stratified by class: each
    class gets its share of ``limit`` (largest remainders, ties to the lower class), its
    members chosen by a seeded permutation of that class.  An evaluation subset of a split
    sorted by class (an image folder's) is not mostly one class, unlike its first N points."""
    n = len(labels)
    if limit is None or limit >= n:
        return list(range(n))
    by_class: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        by_class.setdefault(int(label), []).append(i)
    classes = sorted(by_class)
    quota = {c: limit * len(by_class[c]) / n for c in classes}
    counts = {c: int(quota[c]) for c in classes}
    for c in sorted(classes, key=lambda c: (counts[c] - quota[c], c))[: limit - sum(counts.values())]:
        counts[c] += 1
    chosen = []
    for c in classes:
        members = by_class[c]
        chosen += [members[i] for i in seeded_permutation(len(members), seed, f"{salt}:{c}")[: counts[c]].tolist()]
    return sorted(chosen)


def split_indices(indices: list[int], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Hold out ``round(fraction * len)`` of ``indices`` (at least 1) as a validation set."""
    n_val = max(1, round(fraction * len(indices)))
    if n_val >= len(indices):
        raise SettingError(
            "val_split", f"validation fraction {fraction} leaves no training images ({len(indices)} available)"
        )
    perm = seeded_permutation(len(indices), seed, "val-split").tolist()
    val = sorted(indices[i] for i in perm[:n_val])
    train = sorted(indices[i] for i in perm[n_val:])
    return train, val


def resolve_dataset(choice: str | dict, registry: Registry | None = None) -> Component:
    """``"name"`` / ``"name:key=value"`` -> a dataset Component (unknown names: exit 2)."""
    return (registry or get_registry()).component("dataset", choice)


#: the environment variable naming the default data root
DATA_ENV = "LIPCLI_DATA"
#: the built-in data sets that download themselves (published archives, MD5-checked) and so
#: have a default data root
DOWNLOADABLE = ("cifar10", "cifar100")


def user_cache_dir() -> Path:
    """The platform's per-user cache folder: ``$XDG_CACHE_HOME`` (absolute) or ``~/.cache``
    on Linux and other POSIX systems, ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on
    Windows (as the platformdirs package decides, without depending on it)."""
    import sys

    home = Path(os.path.expanduser("~"))
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA", "")
        return Path(local) if local else home / "AppData" / "Local"
    if sys.platform == "darwin":
        return home / "Library" / "Caches"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return Path(xdg) if os.path.isabs(xdg) else home / ".cache"  # a relative one is invalid


def default_data_root() -> Path:
    """Where a downloadable data set lives when no directory is given: ``$LIPCLI_DATA``,
    else :func:`user_cache_dir` ``/lipcli/data``."""
    env = os.environ.get(DATA_ENV, "").strip()
    return Path(env).expanduser().absolute() if env else user_cache_dir() / "lipcli" / "data"


def check_data_dir(component: Component, root: str | None, download: bool) -> str | None:
    """Validate a data set's directory ``root`` before anything is loaded or written
    (:class:`SettingError` ``data_dir``); returns it with ``~`` expanded."""
    spec: DatasetSpec = component.spec  # type: ignore[assignment]
    if not spec.needs_root:
        return None if root is None else str(root)
    if root is None:
        raise SettingError(
            "data_dir", f"dataset {spec.name!r} needs a data directory (the folder holding its "
            "files; when downloading, where to fetch them); the digits data set is embedded and needs none"
        )
    path = os.path.expanduser(str(root))
    if os.path.exists(path) and not os.path.isdir(path):
        raise SettingError("data_dir", f"data directory {path} is a file, not a directory (dataset {spec.name!r})")
    if not os.path.isdir(path):
        if not download:
            raise SettingError("data_dir", f"data directory {path} does not exist (dataset {spec.name!r})")
        anchor = Path(os.path.abspath(path)).parent
        while not anchor.exists() and anchor != anchor.parent:
            anchor = anchor.parent
        if not anchor.is_dir() or not os.access(anchor, os.W_OK | os.X_OK):
            what = "a file" if anchor.exists() and not anchor.is_dir() else "not writable"
            raise SettingError("data_dir", f"data directory {path} does not exist and cannot be created for "
                                           f"the download: {anchor} is {what} (dataset {spec.name!r})")
    return path


#: what :func:`on_data_loaded` registered: called by :func:`data_loaded`
_LOADED_CALLBACKS: list[Callable[[str | None], None]] = []


@contextlib.contextmanager
def on_data_loaded(callback: Callable[[str | None], None]) -> Iterator[None]:
    """Call ``callback(root)`` whenever a data set has been read from ``root`` while the block
    runs (:func:`data_loaded`): ``lip`` prints its data-root note then, so that a command that
    fails before says one line, its error."""
    _LOADED_CALLBACKS.append(callback)
    try:
        yield
    finally:
        _LOADED_CALLBACKS.remove(callback)


def data_loaded(root: str | None) -> None:
    """Tell the :func:`on_data_loaded` callbacks that a data set was read from ``root``."""
    for callback in list(_LOADED_CALLBACKS):
        callback(root)


def _build(component: Component, root: str | None, split: str, *, download: bool, augment: bool) -> Dataset:
    try:
        return component.build(root, split, download=download, augment=augment)
    except LipUsageError:
        raise
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise LipUsageError(f"dataset {component.name!r}: {exc}") from None


def dataset_labels(ds: Dataset) -> list[int]:
    """The label of every point of ``ds`` (its ``targets`` when it has them)."""
    targets = getattr(ds, "targets", None)
    if targets is not None:
        return [int(t) for t in targets]
    return [int(ds[i][1]) for i in range(len(ds))]  # type: ignore[arg-type]


def load_data(
    component: Component,
    root: str | None,
    *,
    download: bool = False,
    augment: bool = True,
    augmentation: Component | None = None,
    val_split: float = 0.0,
    limit_train: int | None = None,
    limit_test: int | None = None,
    seed: int = 0,
) -> DataBundle:
    """Build the train (augmented; with ``augmentation``, by that policy), validation
    (un-augmented, held out of train) and test sets.

    Normalisation: the train split's ``mean``/``std`` attributes when present (data-derived
    statistics), else the spec's constants.  Classes: the train split's ``classes``, else
    ``spec.num_classes`` numbered names, else ``max(label) + 1``.
    """
    spec: DatasetSpec = component.spec  # type: ignore[assignment]
    train_full = _build(component, root, "train", download=download, augment=augment)
    if augment and augmentation is not None:
        apply_augmentation(train_full, augmentation, spec.name)
    train_plain = _build(component, root, "train", download=False, augment=False) if val_split > 0 else None
    test_full = _build(component, root, "test", download=False, augment=False)
    data_loaded(root)

    classes = list(getattr(train_full, "classes", None) or [])
    if not classes:
        n = spec.num_classes or (max(dataset_labels(train_full)) + 1)
        classes = [str(i) for i in range(n)]
    if spec.num_classes is not None and len(classes) != spec.num_classes:
        raise LipUsageError(
            f"dataset {spec.name!r} declares {spec.num_classes} classes but the data has {len(classes)}"
        )
    if len(classes) < 2:
        raise LipUsageError(f"dataset {spec.name!r} has {len(classes)} class(es); need at least 2")
    mean = tuple(float(m) for m in getattr(train_full, "mean", spec.mean))
    std = tuple(float(s) for s in getattr(train_full, "std", spec.std))
    if len(train_full) == 0 or len(test_full) == 0:  # type: ignore[arg-type]
        raise LipUsageError(f"dataset {spec.name!r}: empty train or test split")

    train_idx = limit_indices(len(train_full), limit_train, seed, "limit-train")  # type: ignore[arg-type]
    val: Dataset | None = None
    if val_split > 0:
        train_idx, val_idx = split_indices(train_idx, val_split, seed)
        val = Subset(train_plain, val_idx)  # type: ignore[arg-type]
    train: Dataset = train_full if len(train_idx) == len(train_full) else Subset(train_full, train_idx)  # type: ignore[arg-type]
    test_idx = stratified_indices(dataset_labels(test_full), limit_test)
    test: Dataset = test_full if len(test_idx) == len(test_full) else Subset(test_full, test_idx)  # type: ignore[arg-type]

    sample = train_full[0][0]
    image_shape = tuple(int(s) for s in sample.shape)
    sizes = {"train": len(train), "test": len(test)}  # type: ignore[arg-type]
    if val is not None:
        sizes["val"] = len(val)  # type: ignore[arg-type]
    return DataBundle(
        component=component, root=root, train=train, test=test, val=val, classes=classes,
        mean=mean, std=std, image_shape=image_shape, sizes=sizes,  # type: ignore[arg-type]
    )


def train_loader(
    dataset: Dataset,
    *,
    batch_size: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    workers: int = 0,
    pin_memory: bool = False,
) -> tuple[DataLoader, DistributedSampler]:
    """Shuffled loader over this process's shard; call ``sampler.set_epoch(e)`` every epoch.

    ``batch_size`` is per process.  The sampler pads the shard so that every process runs the
    same number of steps (DDP needs this); the last batch may be smaller (as the reference).
    """
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=False
    )
    loader = DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
        pin_memory=pin_memory, drop_last=False, generator=torch.Generator(),
        persistent_workers=False,
    )
    return loader, sampler


def eval_loader(
    dataset: Dataset, *, batch_size: int, rank: int = 0, world_size: int = 1, workers: int = 0,
    pin_memory: bool = False,
) -> DataLoader:
    """In-order loader over the images ``rank, rank + world_size, ...`` (no padding, no repeats)."""
    n = len(dataset)  # type: ignore[arg-type]
    shard: Dataset = dataset if world_size == 1 else Subset(dataset, list(range(rank, n, world_size)))
    return DataLoader(shard, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=pin_memory)
