"""What the built-in data sets share: the splits, the image size and training augmentation
(random crop + flip, :mod:`lipcli.sdk.augment`) and the in-memory data set.  (The CIFAR normalisation, every
LipConvnet's default, is a neutral constant of the host: :mod:`lipcli._util.constants`.)"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.utils.data import Dataset

from lipcli.sdk.augment import CROP_PADDING, IMAGE_SIZE, RandomCropFlip
from lipcli.sdk.errors import LipUsageError

__all__ = ["CROP_PADDING", "IMAGE_SIZE", "SPLITS", "RandomCropFlip", "TensorImageDataset", "check_split"]

SPLITS = ("train", "test")


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


def check_split(name: str, split: str) -> None:
    if split not in SPLITS:
        raise LipUsageError(f"dataset {name!r}: unknown split {split!r}; valid: {', '.join(SPLITS)}")
