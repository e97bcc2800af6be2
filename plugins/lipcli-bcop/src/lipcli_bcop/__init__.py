"""lipcli-bcop: a lipcli plugin providing the ``bcop`` convolution.

BCOP (Li et al., NeurIPS 2019): an orthogonal ``k×k`` convolution built from an orthogonal
matrix and ``2(k−1)`` symmetric projectors (two-tap block convolutions), all orthogonalised
with Björck's iteration.
"""

from __future__ import annotations

__version__ = "0.2.0"

from .bcop import BCOPConv, bcop_kernel, bjorck  # noqa: E402

__all__ = ["__version__", "BCOPConv", "bcop_kernel", "bjorck"]
