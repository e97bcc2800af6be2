"""The activation built-in plugin (registered as ``lipcli.activations``): the ``maxmin``
activation (SPEC §2), implemented in :mod:`lipcli.builtins.activations.maxmin`."""

from __future__ import annotations

from lipcli.builtins.activations.maxmin import MaxMin
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ONE_LIPSCHITZ, ActivationSpec

__all__ = ["lip_activations"]


def _maxmin_factory(channels: int) -> MaxMin:
    return MaxMin(channels)


@hookimpl
def lip_activations() -> list[ActivationSpec]:
    return [
        ActivationSpec(
            name="maxmin",
            factory=_maxmin_factory,
            description="MaxMin: cat(max(a, b), min(a, b)) of the two channel halves",
            promises=(ONE_LIPSCHITZ,),
        )
    ]
