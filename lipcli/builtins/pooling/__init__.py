"""The built-in pools ``max`` and ``projection`` (plugin ``lipcli.pooling``, its hook in
:mod:`.plugin`; the layers in :mod:`.pools`, whose names are re-exported here)."""

from lipcli.builtins.pooling.pools import (
    ChannelMaxPool,
    PlainPairMax,
    ProjectionPool,
    cone_signed_distance,
)

__all__ = ["ChannelMaxPool", "PlainPairMax", "ProjectionPool", "cone_signed_distance"]
