"""The training augmentation policy (``lip train --augmentation``, an ``augmentation``
component, :mod:`lipcli.sdk.augment`) against the data set's own augmentation."""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from lipcli.host.defaults import DEFAULT_COMPONENTS
from lipcli.host.registry import Registry, component_choice_text
from lipcli.sdk.augment import RandomCropFlip
from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.specs import Component

__all__ = ["apply_augmentation", "is_default", "resolve_augmentation"]


def is_default(component: Component) -> bool:
    """Whether ``component`` is the default policy with its default parameters (the data
    set's own augmentation, whatever it is)."""
    return (component.name == DEFAULT_COMPONENTS["augmentation"]
            and component.params == component.spec.resolve_params())


def resolve_augmentation(choice: str, augment: bool, registry: Registry) -> tuple[str, Component]:
    """The installed policy ``choice`` and its text as the model file records it (every
    parameter written out; the default policy's name alone, as files without the setting
    imply); a policy other than the default with augmentation off (``--no-augment``) is a
    usage error (one line)."""
    component = registry.component("augmentation", choice)
    if is_default(component):
        return DEFAULT_COMPONENTS["augmentation"], component
    if not augment:
        raise LipUsageError(f"--augmentation {choice} needs augmentation on: drop --no-augment")
    try:  # a policy that rejects its parameters (crossed bounds) is refused before any work
        component.build(RandomCropFlip())
    except (ValueError, TypeError) as exc:
        raise LipUsageError(f"--augmentation {choice}: {' '.join(str(exc).split())}") from None
    return component_choice_text(component.name, component.params), component


def apply_augmentation(dataset: Dataset, component: Component, dataset_name: str) -> None:
    """Give the training split ``dataset`` the policy's transform in place of its own
    :class:`~lipcli.sdk.augment.RandomCropFlip` (nothing for the default policy)."""
    if is_default(component):
        return
    base: Any = getattr(dataset, "transform", None)
    if not isinstance(base, RandomCropFlip):
        raise LipUsageError(
            f"--augmentation {component.name}: the data set {dataset_name!r} trains with "
            f"{type(base).__name__ if base is not None else 'no transform'}, not lipcli's RandomCropFlip "
            "(lipcli.sdk.augment), which augmentation policies build on")
    dataset.transform = component.build(base)  # type: ignore[attr-defined]
