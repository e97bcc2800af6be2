"""lipcli plugin: HouseHolder activations (``--activation householder[:order=2]``)."""

from .householder import HouseHolder, householder_order1, householder_order2

__all__ = ["HouseHolder", "householder_order1", "householder_order2"]
