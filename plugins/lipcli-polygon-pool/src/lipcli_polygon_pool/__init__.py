"""lipcli-polygon-pool: a lipcli plugin providing the ``polygon`` projection pool.

Signed l2 distance of channel pairs to a learnable star-shaped polygon (one per output
channel): the paper's open direction of §6, 1-Lipschitz by Theorem 2 / Corollary 1.
"""

from __future__ import annotations

__version__ = "0.2.0"

from .polygon import PolygonPool, star_polygon_signed_distance  # noqa: E402

__all__ = ["__version__", "PolygonPool", "star_polygon_signed_distance"]
