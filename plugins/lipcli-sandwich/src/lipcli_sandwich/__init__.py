"""lipcli-sandwich: a lipcli plugin providing the ``sandwich`` convolution (and its dense form).

Sandwich layers (Wang & Manchester, *Direct Parameterization of Lipschitz-Bounded Deep
Networks*, ICML 2023): ``√2·Aᵀ·Ψ·σ(√2·Ψ⁻¹·B·h + b)`` with ``[A B]`` from a Cayley transform,
per frequency for the convolution (:mod:`lipcli_sandwich.core`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from .conv import SandwichConv  # noqa: E402
from .dense import SandwichFc  # noqa: E402

__all__ = ["__version__", "SandwichConv", "SandwichFc"]
