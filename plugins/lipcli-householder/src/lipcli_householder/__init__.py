"""lipcli plugin: HouseHolder activations (``--activation householder[:order=2]``)."""

from .householder import HouseHolder, householder_order1, householder_order2

__version__ = "0.2.0"

__all__ = ["__version__", "HouseHolder", "householder_order1", "householder_order2"]
