"""The lipcli plugin module (entry point ``polygon`` in the ``lipcli`` group).

lipcli imports this module and calls its ``@hookimpl`` functions; it provides one
pool component, ``polygon``, used as ``lip train --pool polygon`` or
``lip train --pool polygon:vertices=8,radius=1.5``.
"""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ONE_LIPSCHITZ, Param, PoolSpec

from .polygon import MAX_RADIUS, MAX_VERTICES, MIN_RADIUS, MIN_VERTICES, PolygonPool


def factory(
    channels: int, *, vertices: int = 6, radius: float = 1.0, learn_center: bool = True
) -> PolygonPool:
    """PoolSpec factory: ``(N, channels, H, W) -> (N, channels/2, H, W)``."""
    return PolygonPool(channels, vertices=vertices, radius=radius, learn_center=learn_center)


def polygon_spec() -> PoolSpec:
    """The ``polygon`` pool spec."""
    return PoolSpec(
        name="polygon",
        factory=factory,
        description="signed l2 distance of channel pairs to a learnable star-shaped polygon",
        params=(
            Param(
                name="vertices", type=int, default=6,
                help=f"polygon vertices per output channel ({MIN_VERTICES}-{MAX_VERTICES})",
                choices=tuple(range(MIN_VERTICES, MAX_VERTICES + 1)),
            ),
            Param(name="radius", type=float, default=1.0, min=MIN_RADIUS, min_open=True, max=MAX_RADIUS,
                  help="initial circumradius of the regular polygon"),
            Param(name="learn_center", type=bool, default=True,
                  help="learn each polygon's centre (else fixed at the origin)"),
        ),
        promises=(ONE_LIPSCHITZ,),
    )


@hookimpl
def lip_pools() -> list[PoolSpec]:
    return [polygon_spec()]
