"""The data-set built-in plugin (registered as ``lipcli.datasets``): the ``lip_datasets`` hook
returning the specs of ``cifar10``, ``cifar100``, ``imagefolder`` and ``digits``."""

from __future__ import annotations

from lipcli.builtins.datasets.cifar import _cifar10_factory, _cifar100_factory
from lipcli.builtins.datasets.common import IMAGE_SIZE
from lipcli._util.constants import CIFAR_MEAN, CIFAR_STD  # the paper's statistics (SPEC §2)
from lipcli.builtins.datasets.digits import DIGITS_MEAN, DIGITS_STD, _digits_factory
from lipcli.builtins.datasets.imagefolder import IMAGEFOLDER_SIZES, _imagefolder_factory
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import DatasetSpec, Param


#: ``cifar10`` / ``cifar100``: name -> (classes, factory, description); both use the paper's
#: CIFAR normalisation
_CIFAR = {
    "cifar10": (10, _cifar10_factory,
                "CIFAR-10 (python version) from DIR/cifar-10-batches-py; --download to fetch"),
    "cifar100": (100, _cifar100_factory,
                 "CIFAR-100 (python version, fine labels) from DIR/cifar-100-python"),
}


@hookimpl
def lip_datasets() -> list[DatasetSpec]:
    cifar = [
        DatasetSpec(name=name, factory=factory, description=text, num_classes=classes,
                    mean=CIFAR_MEAN, std=CIFAR_STD)
        for name, (classes, factory, text) in _CIFAR.items()
    ]
    return [
        *cifar,
        DatasetSpec(
            name="imagefolder", factory=_imagefolder_factory, num_classes=None,
            description="any DIR/train/<class>/* + DIR/test/<class>/* tree as size x size RGB (32 default)",
            mean=CIFAR_MEAN, std=CIFAR_STD,
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
            name="digits", factory=_digits_factory, num_classes=10, needs_root=False,
            description="scikit-learn's 1,797 8x8 handwritten digits upscaled to 32x32 (offline)",
            mean=DIGITS_MEAN, std=DIGITS_STD,
        ),
    ]
