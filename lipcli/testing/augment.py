"""Conformance check of an augmentation policy (re-exported by :mod:`lipcli.testing`):
:func:`check_augmentation`."""

from __future__ import annotations

import torch

from lipcli.sdk.augment import RandomCropFlip
from lipcli.sdk.specs import AugmentationSpec
from lipcli.testing.base import fail

__all__ = ["check_augmentation"]


def check_augmentation(spec: AugmentationSpec, params: dict | None = None, *, draws: int = 8) -> None:
    """Build ``spec``'s policy on the crop-and-flip of a CIFAR-like data set and check, on
    ``draws`` random 8-bit images: the output is a float ``(3, 32, 32)`` image in ``[0, 1]``;
    the same torch seed gives the same outputs (the policy draws only from torch's global
    generator, which ``lip train`` seeds per epoch: resumable and reproducible); the input
    image is left unchanged.  Raise ``AssertionError`` naming the policy otherwise."""
    label = f"augmentation {spec.name!r}"
    policy = spec.factory(RandomCropFlip(), **spec.resolve_params(params))
    if not callable(policy):
        fail(f"{label}: the factory returned {type(policy).__name__}, not a transform")
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (draws, 3, 32, 32), generator=gen, dtype=torch.uint8).float() / 255

    def run(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return [policy(x) for x in images]

    first, again = run(1), run(1)
    for x, y in zip(first, again):
        if not isinstance(x, torch.Tensor) or x.shape != (3, 32, 32) or not x.is_floating_point():
            fail(f"{label}: a transformed image must be a float (3, 32, 32) tensor, got "
                 f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
        if float(x.min()) < 0.0 or float(x.max()) > 1.0:
            fail(f"{label}: transformed values leave [0, 1] ({float(x.min()):g}..{float(x.max()):g})")
        if not torch.equal(x, y):
            fail(f"{label}: the same torch seed gave different images: the policy draws from another "
                 "random source (lip train seeds only torch's global generator)")
    copy = images.clone()
    run(2)
    if not torch.equal(copy, images):
        fail(f"{label}: the policy changed its input image in place")
