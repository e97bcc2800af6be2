"""The built-in augmentation policies (:mod:`lipcli.sdk.augment`'s protocol): each wraps the
data set's :class:`~lipcli.sdk.augment.RandomCropFlip` and draws only from torch's global
generator (seeded per epoch by the training driver).

* ``crop-flip``: the data set's own crop and flip; ``padding_mode="reflect"`` pads with a
  reflection of the image (SLL's ``RandomCrop(32, padding=4, padding_mode='reflect')``).
* ``randaugment``: the crop and flip, then with probability ``p`` torchvision's
  ``RandAugment(num_ops, magnitude)`` (LiResNet's and BRONet's CIFAR pipeline:
  ``RandomCrop``, ``RandomHorizontalFlip``, ``RandomApply([RandAugment()])``, whose default
  ``p`` is 1/2).  RandAugment acts on 8-bit images, as the authors' PIL pipeline does: the
  image is rounded to multiples of 1/255 first (exact for CIFAR's 8-bit pixels).
* ``color-jitter``: the crop and flip, then torchvision's ``ColorJitter`` with brightness
  factor in ``[1 − b, 1 + b]``, contrast and saturation factors in the given ranges and a hue
  shift in ``[−h, h]`` (SLL's CIFAR reader: 0.1, (0.5, 2), (0.3, 2), 0.02, after a
  reflection-padded crop and a flip).
"""

from __future__ import annotations

import torch
from torchvision import transforms

from lipcli.sdk.augment import RandomCropFlip


def to_8bit(image: torch.Tensor) -> torch.Tensor:
    """A float image in ``[0, 1]`` as ``uint8`` (rounded to the nearest of 0..255)."""
    return image.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)


class RandAugmentPolicy:
    """The crop and flip, then ``RandAugment`` with probability ``p`` (module docstring)."""

    def __init__(self, base: RandomCropFlip, *, num_ops: int, magnitude: int, p: float) -> None:
        self.base, self.p = base, float(p)
        self.op = transforms.RandAugment(num_ops=num_ops, magnitude=magnitude)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        image = self.base(image)
        if self.p < float(torch.rand(1)):  # torchvision's RandomApply draws the same way
            return image
        return self.op(to_8bit(image)).float().div_(255.0)

    def __repr__(self) -> str:
        return f"RandAugmentPolicy({self.base!r}, {self.op!r}, p={self.p:g})"


class ColorJitterPolicy:
    """The crop and flip, then ``ColorJitter`` (module docstring)."""

    def __init__(self, base: RandomCropFlip, *, brightness: float, contrast: tuple[float, float],
                 saturation: tuple[float, float], hue: float) -> None:
        self.base = base
        self.op = transforms.ColorJitter(brightness=brightness, contrast=contrast, saturation=saturation, hue=hue)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self.op(self.base(image))

    def __repr__(self) -> str:
        return f"ColorJitterPolicy({self.base!r}, {self.op!r})"
