"""``imagefolder``: any tree ``DIR/train/<class>/*.{png,jpg,...}`` and ``DIR/test/<class>/*``;
classes are the sorted sub-directory names of ``train/`` (a test class missing from ``train/``
is an error, and so is a class folder without images, as in torchvision's ImageFolder; labels
of the test split use the train split's numbering). Images are converted to
RGB and resized to ``size`` x ``size`` (parameter ``size``: 32 (default), 64, 128, 256 or 512;
bilinear, antialiased); an image that already has that size is kept exactly as it is
(``imagefolder:size=64`` keeps TinyImageNet's native 64 x 64). The training crop pads by
``size / 8`` pixels (4 at 32, as CIFAR's, 8 at 64). With ``cache=true`` (default) every image is
decoded once into memory as uint8. Normalisation: parameter ``stats`` = ``cifar`` (default: the
CIFAR constants of :mod:`.common`, sensible for natural photographs) or ``data`` (per-channel mean of the
train split and ONE pooled std for all channels, like the paper's single CIFAR std; exposed as
the data set's ``mean``/``std`` attributes, which the training driver prefers over the spec's
constants).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import Dataset

from lipcli.builtins.datasets.common import CROP_PADDING, IMAGE_SIZE, RandomCropFlip, check_split
from lipcli.sdk.errors import LipUsageError, SettingError

#: the image sizes ``imagefolder`` can produce (LipConvnet takes 32·2^k)
IMAGEFOLDER_SIZES = (32, 64, 128, 256, 512)


def _pil_to_tensor(path: str, size: int = IMAGE_SIZE) -> torch.Tensor:
    """Decode ``path``, convert to RGB, resize to ``size`` x ``size`` (bilinear, antialias)
    unless it has that size already: uint8 ``(3, size, size)``."""
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        if img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return data.view(size, size, 3).permute(2, 0, 1).contiguous()



class ImageFolderDataset(Dataset):
    """``DIR/<split>/<class>/<image>`` as ``size`` x ``size`` RGB (see module docstring)."""

    def __init__(
        self,
        samples: list[tuple[str, int]],
        classes: list[str],
        transform: Callable[[torch.Tensor], torch.Tensor] | None,
        cache: bool,
        size: int = IMAGE_SIZE,
    ) -> None:
        self.samples = samples
        self.classes = classes
        self.transform = transform
        self.size = int(size)
        self._cache: torch.Tensor | None = None
        if cache:
            self._cache = self.decode_all()

    @property
    def targets(self) -> list[int]:
        return [label for _, label in self.samples]

    def decode_all(self) -> torch.Tensor:
        """All images as one uint8 tensor ``(N, 3, size, size)``."""
        if self._cache is not None:
            return self._cache
        out = torch.empty((len(self.samples), 3, self.size, self.size), dtype=torch.uint8)
        for i, (path, _) in enumerate(self.samples):
            try:
                out[i] = _pil_to_tensor(path, self.size)
            except Exception as exc:  # noqa: BLE001 - PIL raises many kinds
                raise LipUsageError(f"cannot read image {path}: {exc}") from None
        return out

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        image = self._cache[index] if self._cache is not None else _pil_to_tensor(path, self.size)
        image = image.float().div_(255.0)
        if self.transform is not None:
            image = self.transform(image)
        return image, label


def _class_dirs(directory: Path) -> list[str]:
    return sorted(e.name for e in directory.iterdir() if e.is_dir() and not e.name.startswith("."))


def _refuse_empty_classes(split_dir: Path, present: dict[str, int], samples: list[tuple[str, int]],
                          extensions: tuple[str, ...]) -> None:
    """A class folder of ``split_dir`` without an image is an error (as in torchvision's
    ImageFolder): in ``train/`` it would be a class no image teaches."""
    found = {label for _, label in samples}
    empty = [name for name, label in present.items() if label not in found]
    if empty:
        more = f" (and {len(empty) - 1} more class folder(s) without images)" if len(empty) > 1 else ""
        raise LipUsageError(f"class folder {split_dir / empty[0]} has no images{more}; add images "
                            f"({', '.join(extensions)}) or remove the folder")


def load_imagefolder(
    root: str | Path | None,
    split: str,
    *,
    download: bool = False,
    augment: bool = False,
    cache: bool = True,
    stats: str = "cifar",
    size: int = IMAGE_SIZE,
) -> ImageFolderDataset:
    """An ImageFolder tree ``DIR/train/<class>/*`` + ``DIR/test/<class>/*`` (module docstring)."""
    check_split("imagefolder", split)
    if size not in IMAGEFOLDER_SIZES:
        raise LipUsageError(f"dataset 'imagefolder': size must be one of "
                            f"{', '.join(map(str, IMAGEFOLDER_SIZES))}, got {size}")
    if download:
        raise SettingError("download", "dataset 'imagefolder' cannot be downloaded")
    if root is None:
        raise SettingError("data_dir", "dataset 'imagefolder' needs a data directory")
    root = Path(root).expanduser()
    layout = f"expected {root}/train/<class>/<image> and {root}/test/<class>/<image>"
    train_dir, split_dir = root / "train", root / split
    for d in (train_dir, split_dir):
        if not d.is_dir():
            raise LipUsageError(f"ImageFolder tree not found: {d} is not a directory ({layout})")
    classes = _class_dirs(train_dir)
    if len(classes) < 2:
        raise LipUsageError(f"{train_dir} has {len(classes)} class directories; need at least 2 ({layout})")
    unknown = sorted(set(_class_dirs(split_dir)) - set(classes))
    if unknown:
        raise LipUsageError(f"{split_dir} has classes missing from {train_dir}: {', '.join(unknown[:5])}")
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    class_to_idx = {name: i for i, name in enumerate(classes)}
    present = {name: i for name, i in class_to_idx.items() if (split_dir / name).is_dir()}
    samples = make_dataset(str(split_dir), present, extensions=IMG_EXTENSIONS, allow_empty=True)
    if not samples:
        raise LipUsageError(f"no images found under {split_dir} ({layout}; extensions {', '.join(IMG_EXTENSIONS)})")
    _refuse_empty_classes(split_dir, present, samples, IMG_EXTENSIONS)
    transform = RandomCropFlip(size=size, padding=CROP_PADDING * size // IMAGE_SIZE, flip=True) if augment else None
    ds = ImageFolderDataset(samples, classes, transform, cache, size=size)
    if stats == "data":
        if split == "train":
            train_images = ds.decode_all()
        else:
            train_images = load_imagefolder(root, "train", cache=True, stats="cifar", size=size).decode_all()
        ds.mean, ds.std = pixel_statistics(train_images)
    return ds


def pixel_statistics(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and ONE pooled std (repeated per channel) of images in ``[0, 1]``.

    ``mean_c = E[x_c]``; ``std = sqrt(mean_c Var[x_c])`` (pooled over channels), floored at
    0.05 so that a nearly constant data set cannot give a huge Lipschitz factor ``1/std``.
    """
    x = images.double() / (255.0 if images.dtype == torch.uint8 else 1.0)
    c = x.shape[1]
    flat = x.transpose(0, 1).reshape(c, -1)
    mean = flat.mean(dim=1)
    var = flat.var(dim=1, unbiased=False).mean()
    std = max(float(var.sqrt()), 0.05)
    return tuple(round(float(m), 4) for m in mean), tuple([round(std, 4)] * c)


def _imagefolder_factory(
    root: Any, split: str, *, download: bool = False, augment: bool = False, cache: bool = True,
    stats: str = "cifar", size: int = IMAGE_SIZE,
) -> Dataset:
    return load_imagefolder(root, split, download=download, augment=augment, cache=cache, stats=stats,
                            size=size)
