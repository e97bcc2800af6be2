"""``digits``: scikit-learn's bundled handwritten digits (``sklearn.datasets.load_digits``: 1,797
real 8 x 8 grey images of 0-9 with 16 grey levels), offline, no ``DIR`` needed. Pixels are
scaled to ``[0, 1]`` (``/ 16``), upscaled to 32 x 32 by bilinear interpolation
(``align_corners=False``) and repeated over 3 channels. Fixed split: stratified 80 / 20 with
``sklearn.model_selection.train_test_split(random_state=0)`` -> 1,437 train and 360 test
images. Normalisation constants computed once over the upscaled TRAIN split and fixed here:
mean 0.3054 (every channel), std 0.3237 (every channel).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from lipcli.builtins.datasets.common import IMAGE_SIZE, RandomCropFlip, TensorImageDataset, check_split

#: digits constants (see module docstring): train split, after upscaling to 32 x 32
DIGITS_MEAN: tuple[float, float, float] = (0.3054, 0.3054, 0.3054)
DIGITS_STD: tuple[float, float, float] = (0.3237, 0.3237, 0.3237)
#: the fixed digits split
DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0

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
    check_split("digits", split)
    images, labels = load_digits_images()
    train_idx, test_idx = digits_split_indices()
    idx = torch.as_tensor(train_idx if split == "train" else test_idx)
    transform = RandomCropFlip(flip=False) if augment else None
    return TensorImageDataset(images[idx].clone(), labels[idx].clone(), DIGIT_CLASSES, transform)


def _digits_factory(root: Any, split: str, *, download: bool = False, augment: bool = False) -> Dataset:
    return load_digits_dataset(split, augment=augment)
