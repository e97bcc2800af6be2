"""lipcli-cayley: a lipcli plugin providing the ``cayley`` convolution.

Trockman & Kolter (ICLR 2021): an orthogonal convolution obtained by applying the Cayley
transform to the skew-Hermitian part of the filter's matrix at every spatial frequency.
"""

from __future__ import annotations

__version__ = "0.2.0"

from .cayley import CayleyConv, cayley  # noqa: E402

__all__ = ["__version__", "CayleyConv", "cayley"]
