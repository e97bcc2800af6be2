"""lipcli-cpl: a lipcli plugin providing the ``cpl`` convolution (and its dense form).

CPL (Meunier, Delattre, Araujo & Allauzen, *A Dynamical System Perspective for Lipschitz Neural
Networks*, ICML 2022) is ``x − (2/‖W‖²)·Wᵀσ(Wx + b)``; lipcli certifies it with a verified
upper bound of ``‖W‖`` (:mod:`lipcli_cpl.core`), never with the power-iteration estimate.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .conv import CPLConv  # noqa: E402
from .core import cpl_layer_bound  # noqa: E402
from .dense import CPLLinear  # noqa: E402

__all__ = ["__version__", "CPLConv", "CPLLinear", "cpl_layer_bound"]
