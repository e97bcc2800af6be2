"""The built-in architecture LipConvnet-n (plugin ``lipcli.lipconvnet``, its hook in
:mod:`.plugin`; the network in :mod:`.network`, whose names are re-exported here)."""

from lipcli.builtins.lipconvnet.network import (
    DEPTHS,
    TOTAL_STRIDE,
    LipConvnet,
    Normalize,
    extra_blocks,
)

__all__ = ["DEPTHS", "TOTAL_STRIDE", "LipConvnet", "Normalize", "extra_blocks"]
