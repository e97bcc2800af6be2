"""The lipcli plugin module (entry point ``householder`` in the ``lipcli`` group).

Provides one activation, ``householder``: ``lip train --activation householder`` (order 1,
the paper's ``hh1``) or ``--activation householder:order=2`` (``hh2``).
"""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ONE_LIPSCHITZ, ActivationSpec, Param

from .householder import ORDERS, HouseHolder


def factory(channels: int, *, order: int = 1) -> HouseHolder:
    """ActivationSpec factory: shape-preserving, ``channels`` even."""
    return HouseHolder(channels, order=order)


def householder_spec() -> ActivationSpec:
    """The ``householder`` activation spec."""
    return ActivationSpec(
        name="householder",
        factory=factory,
        description="HouseHolder activation (learnable reflections of channel pairs), order 1 or 2",
        params=(
            Param(name="order", type=int, default=1, choices=ORDERS,
                  help="1: one reflection (hh1); 2: four sectors, reflections and a rotation (hh2)"),
        ),
        promises=(ONE_LIPSCHITZ,),
    )


@hookimpl
def lip_activations() -> list[ActivationSpec]:
    return [householder_spec()]
