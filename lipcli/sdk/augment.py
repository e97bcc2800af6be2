"""Training augmentation (plugin SDK): the crop-and-flip every built-in data set trains with,
and the protocol of augmentation components.

A data set's training split applies its ``transform`` attribute to each ``(C, H, W)`` float
image in ``[0, 1]``; the built-in data sets use :class:`RandomCropFlip` (SPEC §6).  An
augmentation component (``lip train --augmentation NAME[:key=value,...]``, hook
``lip_augmentations``, :class:`~lipcli.sdk.specs.AugmentationSpec`) has a factory
``factory(base, **params) -> transform`` that receives that :class:`RandomCropFlip` (the data
set's crop size, padding and whether it flips) and returns the transform training uses
instead.  Random numbers come from torch's global generator, which the training driver seeds
per ``(seed, epoch, rank)``, so a policy is reproducible and resumable as long as it draws
only from it (torchvision's transforms do).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IMAGE_SIZE = 32
CROP_PADDING = 4
#: how :class:`RandomCropFlip` fills the border it pads: zeros (torchvision's default fill) or a
#: reflection of the image (``RandomCrop(..., padding_mode="reflect")``)
PADDING_MODES = ("zero", "reflect")


class RandomCropFlip:
    """Pad by ``padding`` (zeros, or a reflection with ``padding_mode="reflect"``), take a
    random ``size`` crop, flip horizontally with p = 1/2.

    Operates on a ``(C, H, W)`` tensor; equivalent to torchvision's
    ``RandomCrop(size, padding=padding, padding_mode=...)`` (fill 0) followed by
    ``RandomHorizontalFlip()`` (the flip is skipped when ``flip`` is false).  Uses torch's
    global generator.
    """

    def __init__(self, size: int = IMAGE_SIZE, padding: int = CROP_PADDING, flip: bool = True,
                 padding_mode: str = "zero") -> None:
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {', '.join(PADDING_MODES)}, got {padding_mode!r}")
        self.size, self.padding, self.flip, self.padding_mode = size, padding, flip, padding_mode

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        p = self.padding
        if p:
            if self.padding_mode == "zero":
                image = F.pad(image, (p, p, p, p))
            else:
                image = F.pad(image[None], (p, p, p, p), mode="reflect")[0]
        h, w = image.shape[-2:]
        top = int(torch.randint(0, h - self.size + 1, (1,)))
        left = int(torch.randint(0, w - self.size + 1, (1,)))
        image = image[..., top : top + self.size, left : left + self.size]
        if self.flip and bool(torch.rand(1) < 0.5):
            image = image.flip(-1)
        return image.contiguous()

    def with_padding_mode(self, padding_mode: str) -> "RandomCropFlip":
        """The same crop and flip with another border."""
        return RandomCropFlip(self.size, self.padding, self.flip, padding_mode)

    def __repr__(self) -> str:
        mode = f", padding_mode={self.padding_mode}" if self.padding_mode != "zero" else ""
        return f"RandomCropFlip(size={self.size}, padding={self.padding}, flip={self.flip}{mode})"
