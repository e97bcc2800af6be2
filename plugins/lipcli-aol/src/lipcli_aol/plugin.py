"""The lipcli plugin module (entry point ``aol`` in the ``lipcli`` group).

Provides one convolution component, ``aol``: ``lip train --conv aol``.
"""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ConvSpec

from .aol import AOLConv


def aol_spec() -> ConvSpec:
    """The ``aol`` conv spec: no promise; the layer's ``lipschitz_upper_bound()`` is a
    verified bound (about 1 + 1e-7 for float32 weights) on the weights actually used."""
    return ConvSpec(
        name="aol",
        factory=AOLConv,
        description="AOL: convolution rescaled to l2 norm <= 1 (Prach & Lampert, ECCV 2022)",
        params=(),
        promises=(),
    )


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [aol_spec()]
