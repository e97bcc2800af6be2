"""The built-in data sets ``cifar10``, ``cifar100``, ``imagefolder`` and ``digits`` (plugin
``lipcli.datasets``, its hook in :mod:`.plugin`).

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

Modules: :mod:`.common` (the contract's pieces: splits, augmentation, the in-memory data set),
:mod:`.cifar` (``cifar10``, ``cifar100``; the CIFAR normalisation every LipConvnet defaults to
is in :mod:`lipcli._util.constants`), :mod:`.imagefolder`, :mod:`.digits`, :mod:`.plugin` (the
``lip_datasets`` hook).  The names below are re-exported here.
"""

from lipcli.builtins.datasets.cifar import load_cifar
from lipcli.builtins.datasets.common import (
    CROP_PADDING,
    IMAGE_SIZE,
    SPLITS,
    RandomCropFlip,
    TensorImageDataset,
)
from lipcli.builtins.datasets.digits import (
    DIGITS_MEAN,
    DIGITS_STD,
    digits_split_indices,
    load_digits_dataset,
    load_digits_images,
)
from lipcli.builtins.datasets.imagefolder import (
    IMAGEFOLDER_SIZES,
    ImageFolderDataset,
    load_imagefolder,
    pixel_statistics,
)
from lipcli._util.constants import CIFAR_MEAN, CIFAR_STD

__all__ = [
    "CIFAR_MEAN",
    "CIFAR_STD",
    "CROP_PADDING",
    "DIGITS_MEAN",
    "DIGITS_STD",
    "IMAGEFOLDER_SIZES",
    "IMAGE_SIZE",
    "SPLITS",
    "ImageFolderDataset",
    "RandomCropFlip",
    "TensorImageDataset",
    "digits_split_indices",
    "load_cifar",
    "load_digits_dataset",
    "load_digits_images",
    "load_imagefolder",
    "pixel_statistics",
]
