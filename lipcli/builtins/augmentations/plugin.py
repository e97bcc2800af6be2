"""The augmentation built-in plugin (registered as ``lipcli.augmentations``): the policies of
:mod:`lipcli.builtins.augmentations.policies` as components."""

from __future__ import annotations

from lipcli.sdk.augment import PADDING_MODES, RandomCropFlip
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import AugmentationSpec, Param

__all__ = ["lip_augmentations"]


def _padding(default: str = "zero") -> Param:
    return Param(name="padding_mode", type=str, default=default, choices=PADDING_MODES,
                 help="border of the random crop: zero (torchvision's fill 0) or reflect")


def _crop_flip(base: RandomCropFlip, *, padding_mode: str = "zero") -> RandomCropFlip:
    return base if padding_mode == base.padding_mode else base.with_padding_mode(padding_mode)


def _randaugment(base: RandomCropFlip, *, num_ops: int = 2, magnitude: int = 9, p: float = 0.5,
                 padding_mode: str = "zero") -> object:
    from .policies import RandAugmentPolicy  # torchvision: imported when a policy is built

    return RandAugmentPolicy(_crop_flip(base, padding_mode=padding_mode), num_ops=num_ops, magnitude=magnitude, p=p)


def _color_jitter(base: RandomCropFlip, *, brightness: float = 0.1, contrast_min: float = 0.5,
                  contrast_max: float = 2.0, saturation_min: float = 0.3, saturation_max: float = 2.0,
                  hue: float = 0.02, padding_mode: str = "reflect") -> object:
    from .policies import ColorJitterPolicy  # torchvision: imported when a policy is built

    for name, low, high in (("contrast", contrast_min, contrast_max), ("saturation", saturation_min, saturation_max)):
        if low > high:
            raise ValueError(f"{name}_min must be at most {name}_max, got {low} > {high}")
    return ColorJitterPolicy(_crop_flip(base, padding_mode=padding_mode), brightness=brightness,
                             contrast=(contrast_min, contrast_max), saturation=(saturation_min, saturation_max), hue=hue)


@hookimpl
def lip_augmentations() -> list[AugmentationSpec]:
    return [
        AugmentationSpec(name="crop-flip", factory=_crop_flip,
                         description="the data set's random crop (+ flip), SPEC §6",
                         params=(_padding(),)),
        AugmentationSpec(
            name="randaugment", factory=_randaugment,
            description="crop (+ flip), then torchvision RandAugment with probability p (LiResNet, BRONet)",
            params=(Param(name="num_ops", type=int, default=2, min=0, max=14, help="operations per image"),
                    Param(name="magnitude", type=int, default=9, min=0, max=30, help="their strength (of 31 bins)"),
                    Param(name="p", type=float, default=0.5, min=0.0, max=1.0,
                          help="probability of applying RandAugment (torchvision RandomApply's 0.5)"),
                    _padding())),
        AugmentationSpec(
            name="color-jitter", factory=_color_jitter,
            description="crop (+ flip), then torchvision ColorJitter (defaults: SLL's CIFAR reader)",
            params=(Param(name="brightness", type=float, default=0.1, min=0.0, max=1.0,
                          help="brightness factor in [1 - b, 1 + b]"),
                    Param(name="contrast_min", type=float, default=0.5, min=0.0, max=10.0, help="lowest contrast factor"),
                    Param(name="contrast_max", type=float, default=2.0, min=0.0, max=10.0, help="highest contrast factor"),
                    Param(name="saturation_min", type=float, default=0.3, min=0.0, max=10.0,
                          help="lowest saturation factor"),
                    Param(name="saturation_max", type=float, default=2.0, min=0.0, max=10.0,
                          help="highest saturation factor"),
                    Param(name="hue", type=float, default=0.02, min=0.0, max=0.5, help="hue shift in [-hue, hue]"),
                    _padding("reflect"))),  # SLL's reader pads by reflection
    ]
