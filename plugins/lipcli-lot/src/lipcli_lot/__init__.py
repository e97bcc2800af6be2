"""lipcli-lot: a lipcli plugin providing the ``lot`` convolution, the LOT authors' networks and
last layer, and the importer ``lot`` for their checkpoints.

Xu, Li & Li (NeurIPS 2022, "LOT"): at every spatial frequency the polar factor
``V(VᴴV)^{-1/2}`` of the filter's matrix, computed by Newton–Schulz iterations.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .lot import LOTConv, lot_polar  # noqa: E402

__all__ = ["__version__", "LOTConv", "lot_polar"]
