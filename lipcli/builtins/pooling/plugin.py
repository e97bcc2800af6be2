"""The pooling built-in plugin (registered as ``lipcli.pooling``): the channel-halving pools
``max`` and ``projection`` (SPEC §2), implemented in :mod:`lipcli.builtins.pooling.pools`."""

from __future__ import annotations

from lipcli.builtins.pooling.pools import ChannelMaxPool, ProjectionPool
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ONE_LIPSCHITZ, PoolSpec

__all__ = ["lip_pools"]


def _max_factory(channels: int) -> ChannelMaxPool:
    return ChannelMaxPool(channels)


def _projection_factory(channels: int) -> ProjectionPool:
    return ProjectionPool(channels)


@hookimpl
def lip_pools() -> list[PoolSpec]:
    return [
        PoolSpec(
            name="max",
            factory=_max_factory,
            description="max of the two channel halves (baseline)",
            promises=(ONE_LIPSCHITZ,),
        ),
        PoolSpec(
            name="projection",
            factory=_projection_factory,
            description="signed l2 distance of channel pairs to a learnable cone (paper §6)",
            promises=(ONE_LIPSCHITZ,),
        ),
    ]
