"""The lipcli plugin module (entry point ``cayley`` in the ``lipcli`` group).

Provides one convolution component, ``cayley``: ``lip train --conv cayley``.
"""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ORTHOGONAL, ConvSpec

from .cayley import CayleyConv


def cayley_spec() -> ConvSpec:
    """The ``cayley`` conv spec: orthogonal (semi-orthogonal for ``in ≠ out``) in exact
    arithmetic; ``lipschitz_upper_bound()`` is a verified bound for the float matrices used."""
    return ConvSpec(
        name="cayley",
        factory=CayleyConv,
        description="Cayley orthogonal convolution in the Fourier domain (Trockman & Kolter, ICLR 2021)",
        params=(),
        promises=(ORTHOGONAL,),
    )


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [cayley_spec()]
