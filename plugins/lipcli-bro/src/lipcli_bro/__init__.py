"""lipcli-bro: a lipcli plugin providing the ``bro`` convolution.

Lai et al. (ICML 2025, "BRONet"): an orthogonal convolution whose matrix at every spatial
frequency is the block reflector ``I − 2V(VᴴV)⁻¹Vᴴ`` of a low-rank learnable filter ``V``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .bro import BROConv, block_reflector  # noqa: E402

__all__ = ["__version__", "BROConv", "block_reflector"]
