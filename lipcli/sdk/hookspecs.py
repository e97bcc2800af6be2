"""Hook specifications of the ``lipcli`` plugin system.

Every hook takes no arguments and returns a list of spec objects (see :mod:`lipcli.sdk.specs`).
A plugin implements any subset of them with ``@hookimpl`` (this module's).  Names are global per kind:
two plugins returning the same name for the same kind is an error naming both providers.
"""

from __future__ import annotations

import pluggy

from lipcli.sdk.specs import (
    ActivationSpec,
    AugmentationSpec,
    ArchSpec,
    CertificateSpec,
    ConvSpec,
    DatasetSpec,
    HeadSpec,
    ImporterSpec,
    LossSpec,
    OptimizerSpec,
    PoolSpec,
    RecipeSpec,
)

PROJECT_NAME = "lipcli"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def lip_convolutions() -> list[ConvSpec]:
    """Convolution layers, e.g. ``soc-fast`` and ``soc``."""


@hookspec
def lip_activations() -> list[ActivationSpec]:
    """Shape-preserving activations, e.g. ``maxmin``."""


@hookspec
def lip_pools() -> list[PoolSpec]:
    """Channel-halving pooling layers, e.g. ``max`` and ``projection``."""


@hookspec
def lip_heads() -> list[HeadSpec]:
    """Classification heads, each naming its certificate method, e.g. ``lln`` and ``mlp``."""


@hookspec
def lip_certificates() -> list[CertificateSpec]:
    """Certificate methods, e.g. ``lln`` and ``crc-lip``."""


@hookspec
def lip_architectures() -> list[ArchSpec]:
    """Architectures, e.g. ``lipconvnet-5`` ... ``lipconvnet-40``."""


@hookspec
def lip_datasets() -> list[DatasetSpec]:
    """Data sets, e.g. ``cifar10``, ``cifar100``, ``imagefolder``, ``digits``."""


@hookspec
def lip_losses() -> list[LossSpec]:
    """Training losses, e.g. ``ce``, ``crc-lip``, ``cr``, ``margin-offset``."""


@hookspec
def lip_augmentations() -> list[AugmentationSpec]:
    """Training augmentation policies, e.g. ``crop-flip``, ``randaugment``, ``color-jitter``."""


@hookspec
def lip_recipes() -> list[RecipeSpec]:
    """Training recipes: named, versioned ``lip train`` settings from a paper, each value
    with the file of the authors' code it was read from (``lip train --recipe NAME``)."""


@hookspec
def lip_importers() -> list[ImporterSpec]:
    """Checkpoint importers for ``lip import --from NAME``, e.g. ``improved-l2`` (the paper's code)."""


@hookspec
def lip_optimizers() -> list[OptimizerSpec]:
    """Optimisers for ``lip train --optimizer NAME``, e.g. ``sgd``, ``adamw``, ``nadam``
    (protocol in :mod:`lipcli.sdk.optimizers`)."""


#: hook name -> spec kind it returns
HOOK_KINDS: dict[str, str] = {
    "lip_convolutions": ConvSpec.kind,
    "lip_activations": ActivationSpec.kind,
    "lip_pools": PoolSpec.kind,
    "lip_heads": HeadSpec.kind,
    "lip_certificates": CertificateSpec.kind,
    "lip_architectures": ArchSpec.kind,
    "lip_datasets": DatasetSpec.kind,
    "lip_losses": LossSpec.kind,
    "lip_augmentations": AugmentationSpec.kind,
    "lip_recipes": RecipeSpec.kind,
    "lip_importers": ImporterSpec.kind,
    "lip_optimizers": OptimizerSpec.kind,
}
