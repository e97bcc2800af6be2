"""lipcli-aol: a lipcli plugin providing the ``aol`` convolution.

AOL (Prach & Lampert, ECCV 2022): the filter's input channels are rescaled by
``(Σ_{j,δ} |KᵀK|[i, j, δ])^{-1/2}``, which makes the convolution's l2 norm at most 1.
"""

from __future__ import annotations

__version__ = "0.2.0"

from .aol import AOLConv, aol_rescale, aol_row_sums  # noqa: E402

__all__ = ["__version__", "AOLConv", "aol_rescale", "aol_row_sums"]
