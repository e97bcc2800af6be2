"""What the built-in data sets share: the splits, the image size and training augmentation
(random crop + flip) and the in-memory data set.  (The CIFAR normalisation, every
LipConvnet's default, is a neutral constant of the host: :mod:`lipcli._util.constants`.)"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from lipcli.sdk.errors import LipUsageError

IMAGE_SIZE = 32
CROP_PADDING = 4
SPLITS = ("train", "test")


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


def check_split(name: str, split: str) -> None:
    if split not in SPLITS:
        raise LipUsageError(f"dataset {name!r}: unknown split {split!r}; valid: {', '.join(SPLITS)}")
