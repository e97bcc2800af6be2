"""Built-in data sets: ``cifar10``, ``cifar100``, ``imagefolder`` and ``digits``.

Every factory follows the :class:`~lipcli.sdk.specs.DatasetSpec` contract
``factory(root, split, *, download=False, augment=False, **params)`` and returns a
``torch.utils.data.Dataset`` of ``(image, label)`` pairs where ``image`` is a float tensor
``(3, 32, 32)`` with values in ``[0, 1]`` and ``label`` an ``int``.  Images are NOT normalised
here: the model's first layer subtracts the data set's mean and divides by its std (SPEC §2),
so the normalisation is recorded in the model file and counted in its Lipschitz constant
(``1 / min(std)``, SPEC §5).  Each returned data set also has ``classes`` (class names, index =
label) and ``targets`` (all labels, in order).

Training augmentation (SPEC §6, ``augment=True``): a random 32 x 32 crop of the image
zero-padded by 4 pixels on every side, then a horizontal flip with probability 1/2 (the same
as torchvision's ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip()``, applied to
tensors).  ``digits`` uses the crop only: a mirrored digit is a different symbol.  Random
numbers come from torch's global generator (per worker process in a ``DataLoader``), so the
training driver makes them reproducible by seeding per epoch.

Data sets
---------
``cifar10`` / ``cifar100``
    The "python version" archives of https://www.cs.toronto.edu/~kriz/cifar.html as
    torchvision stores them: ``DIR/cifar-10-batches-py/{data_batch_1..5, test_batch,
    batches.meta}`` and ``DIR/cifar-100-python/{train, test, meta}``.  ``download=True``
    (``lip train --download``) lets torchvision fetch and verify the archive into ``DIR``;
    otherwise nothing is downloaded and a missing file is an error naming the expected layout.
    The files are Python pickles; they are read with a restricted unpickler that only
    rebuilds dicts, lists, strings, numbers and numpy arrays, so a tampered file cannot run
    code.  Normalisation: mean (0.4914, 0.4822, 0.4465), std 0.2507 for every channel (the
    paper's constants, used for CIFAR-100 too).
``imagefolder``
    Any tree ``DIR/train/<class>/*.{png,jpg,...}`` and ``DIR/test/<class>/*``; classes are the
    sorted sub-directory names of ``train/`` (a test class missing from ``train/`` is an
    error; labels of the test split use the train split's numbering).  Images are converted
    to RGB and resized to ``size`` x ``size`` (parameter ``size``: 32 (default), 64, 128, 256
    or 512; bilinear, antialiased); an image that already has that size is kept exactly as
    it is (``imagefolder:size=64`` keeps TinyImageNet's native 64 x 64).  The training crop
    pads by ``size / 8`` pixels (4 at 32, as CIFAR's, 8 at 64).  With ``cache=true`` (default) every
    image is decoded once into memory as uint8.  Normalisation: parameter ``stats`` =
    ``cifar`` (default: the CIFAR constants above, sensible for natural photographs) or
    ``data`` (per-channel mean of the train split and ONE pooled std for all channels, like
    the paper's single CIFAR std; exposed as the data set's ``mean``/``std`` attributes,
    which the training driver prefers over the spec's constants).
``digits``
    scikit-learn's bundled handwritten digits (``sklearn.datasets.load_digits``: 1,797 real
    8 x 8 grey images of 0-9 with 16 grey levels), offline, no ``DIR`` needed.  Pixels are
    scaled to ``[0, 1]`` (``/ 16``), upscaled to 32 x 32 by bilinear interpolation
    (``align_corners=False``) and repeated over 3 channels.  Fixed split: stratified 80 / 20
    with ``sklearn.model_selection.train_test_split(random_state=0)`` -> 1,437 train and 360
    test images.  Normalisation constants computed once over the upscaled TRAIN split and
    fixed here: mean 0.3054 (every channel), std 0.3237 (every channel).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from lipcli.sdk.errors import LipError, LipUsageError
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import DatasetSpec, Param

#: CIFAR-10 statistics used by the paper, also for CIFAR-100; the reference uses one std for
#: every channel (SPEC §2).  The default input normalisation of every LipConvnet.
CIFAR_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR_STD: tuple[float, float, float] = (0.2507, 0.2507, 0.2507)
#: digits constants (see module docstring): train split, after upscaling to 32 x 32
DIGITS_MEAN: tuple[float, float, float] = (0.3054, 0.3054, 0.3054)
DIGITS_STD: tuple[float, float, float] = (0.3237, 0.3237, 0.3237)
#: the fixed digits split
DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0

IMAGE_SIZE = 32
CROP_PADDING = 4
SPLITS = ("train", "test")

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = ("test_batch",)
CIFAR10_META = "batches.meta"
CIFAR100_DIR = "cifar-100-python"
CIFAR100_TRAIN = ("train",)
CIFAR100_TEST = ("test",)
CIFAR100_META = "meta"


# ---------------------------------------------------------------------------------------------
# augmentation and the in-memory data set
# ---------------------------------------------------------------------------------------------
class RandomCropFlip:
    """Zero-pad by ``padding``, take a random ``size`` crop, flip horizontally with p = 1/2.

    Operates on a ``(C, H, W)`` tensor; equivalent to torchvision's
    ``RandomCrop(size, padding=padding)`` (fill 0) followed by ``RandomHorizontalFlip()``
    (the flip is skipped when ``flip`` is false).  Uses torch's global generator.
    """

    def __init__(self, size: int = IMAGE_SIZE, padding: int = CROP_PADDING, flip: bool = True) -> None:
        self.size, self.padding, self.flip = size, padding, flip

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        p = self.padding
        if p:
            image = F.pad(image, (p, p, p, p))
        h, w = image.shape[-2:]
        top = int(torch.randint(0, h - self.size + 1, (1,)))
        left = int(torch.randint(0, w - self.size + 1, (1,)))
        image = image[..., top : top + self.size, left : left + self.size]
        if self.flip and bool(torch.rand(1) < 0.5):
            image = image.flip(-1)
        return image.contiguous()

    def __repr__(self) -> str:
        return f"RandomCropFlip(size={self.size}, padding={self.padding}, flip={self.flip})"


class TensorImageDataset(Dataset):
    """Images held in memory as one tensor ``(N, C, H, W)`` (uint8 0-255 or float 0-1).

    ``__getitem__`` returns ``(float image in [0, 1], int label)`` after the optional
    ``transform`` (training augmentation).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: Sequence[int] | torch.Tensor,
        classes: Sequence[str],
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        if images.dim() != 4:
            raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
        labels_t = torch.as_tensor(labels, dtype=torch.int64).flatten()
        if labels_t.numel() != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {labels_t.numel()} labels")
        self.images = images
        self.labels = labels_t
        self.classes = list(classes)
        self.transform = transform

    @property
    def targets(self) -> list[int]:
        return self.labels.tolist()

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        image = image.float().div_(255.0) if image.dtype == torch.uint8 else image.float()
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])


def _check_split(name: str, split: str) -> None:
    if split not in SPLITS:
        raise LipUsageError(f"dataset {name!r}: unknown split {split!r}; valid: {', '.join(SPLITS)}")


# ---------------------------------------------------------------------------------------------
# CIFAR
# ---------------------------------------------------------------------------------------------
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


def _download_cifar(variant: str, root: Path) -> None:
    """Let torchvision download, verify (MD5) and extract the archive into ``root``."""
    import torchvision

    cls = torchvision.datasets.CIFAR10 if variant == "cifar10" else torchvision.datasets.CIFAR100
    try:
        root.mkdir(parents=True, exist_ok=True)
        cls(str(root), train=True, download=True)
    except Exception as exc:  # noqa: BLE001 - network errors of every kind: runtime (exit 1)
        raise LipError(f"could not download {variant} into {root}: {exc}") from None


def load_cifar(
    variant: str, root: str | Path | None, split: str, *, download: bool = False, augment: bool = False
) -> TensorImageDataset:
    """CIFAR-10 (``variant="cifar10"``) or CIFAR-100 (``"cifar100"``, fine labels)."""
    _check_split(variant, split)
    title = "CIFAR-10" if variant == "cifar10" else "CIFAR-100"
    if root is None:
        raise LipUsageError(f"{title} needs a data directory (--data-dir DIR)")
    root = Path(root).expanduser()
    base, train_files, test_files, meta_file = _cifar_layout(variant, root)
    files = train_files if split == "train" else test_files
    needed = [base / f for f in (*files, meta_file)]
    if download and not all(p.is_file() for p in needed):
        _download_cifar(variant, root)
    missing = [p for p in needed if not p.is_file()]
    if missing:
        raise LipUsageError(
            f"{title} not found in {root} (missing {missing[0]}): expected "
            f"{_layout_hint(variant, root)} (the 'python version'); pass --download to fetch it"
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


# ---------------------------------------------------------------------------------------------
# ImageFolder
# ---------------------------------------------------------------------------------------------
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


def _pil_to_tensor32(path: str) -> torch.Tensor:
    """:func:`_pil_to_tensor` at 32 x 32."""
    return _pil_to_tensor(path, IMAGE_SIZE)


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
    _check_split("imagefolder", split)
    if size not in IMAGEFOLDER_SIZES:
        raise LipUsageError(f"dataset 'imagefolder': size must be one of "
                            f"{', '.join(map(str, IMAGEFOLDER_SIZES))}, got {size}")
    if download:
        raise LipUsageError("dataset 'imagefolder' cannot be downloaded; drop --download")
    if root is None:
        raise LipUsageError("dataset 'imagefolder' needs a data directory (--data-dir DIR)")
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


# ---------------------------------------------------------------------------------------------
# digits
# ---------------------------------------------------------------------------------------------
DIGIT_CLASSES = [str(i) for i in range(10)]


def digits_split_indices() -> tuple[list[int], list[int]]:
    """The fixed stratified 80/20 split of the 1,797 digits (``random_state=0``)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    target = load_digits().target
    train, test = train_test_split(
        list(range(len(target))), test_size=DIGITS_TEST_FRACTION, stratify=target,
        random_state=DIGITS_SPLIT_SEED,
    )
    return sorted(train), sorted(test)


def load_digits_images() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as float images ``(N, 3, 32, 32)`` in ``[0, 1]`` and labels ``(N,)``."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.as_tensor(bunch.images, dtype=torch.float32).div_(16.0).unsqueeze(1)
    x = F.interpolate(x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
    x = x.clamp_(0.0, 1.0).expand(-1, 3, -1, -1).contiguous()
    return x, torch.as_tensor(bunch.target, dtype=torch.int64)


def load_digits_dataset(split: str, *, augment: bool = False) -> TensorImageDataset:
    _check_split("digits", split)
    images, labels = load_digits_images()
    train_idx, test_idx = digits_split_indices()
    idx = torch.as_tensor(train_idx if split == "train" else test_idx)
    transform = RandomCropFlip(flip=False) if augment else None
    return TensorImageDataset(images[idx].clone(), labels[idx].clone(), DIGIT_CLASSES, transform)


def _digits_factory(root: Any, split: str, *, download: bool = False, augment: bool = False) -> Dataset:
    return load_digits_dataset(split, augment=augment)


# ---------------------------------------------------------------------------------------------
@hookimpl
def lip_datasets() -> list[DatasetSpec]:
    return [
        DatasetSpec(
            name="cifar10",
            factory=_cifar10_factory,
            description="CIFAR-10 (python version) from DIR/cifar-10-batches-py; --download to fetch",
            num_classes=10,
            mean=CIFAR_MEAN,
            std=CIFAR_STD,
        ),
        DatasetSpec(
            name="cifar100",
            factory=_cifar100_factory,
            description="CIFAR-100 (python version, fine labels) from DIR/cifar-100-python",
            num_classes=100,
            mean=CIFAR_MEAN,
            std=CIFAR_STD,
        ),
        DatasetSpec(
            name="imagefolder",
            factory=_imagefolder_factory,
            description="any DIR/train/<class>/* + DIR/test/<class>/* tree as size x size RGB (32 default)",
            num_classes=None,
            mean=CIFAR_MEAN,
            std=CIFAR_STD,
            params=(
                Param(name="cache", type=bool, default=True, help="decode all images into memory once"),
                Param(
                    name="stats", type=str, default="cifar", choices=("cifar", "data"),
                    help="normalisation: CIFAR constants or computed from the train split",
                ),
                Param(name="size", type=int, default=IMAGE_SIZE, choices=IMAGEFOLDER_SIZES,
                      help="image side in pixels (resized unless already this size)"),
            ),
        ),
        DatasetSpec(
            name="digits",
            factory=_digits_factory,
            description="scikit-learn's 1,797 8x8 handwritten digits upscaled to 32x32 (offline)",
            num_classes=10,
            mean=DIGITS_MEAN,
            std=DIGITS_STD,
            needs_root=False,
        ),
    ]
