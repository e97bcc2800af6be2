"""The lipcli plugin module (entry point ``bcop`` in the ``lipcli`` group).

Provides one convolution component, ``bcop``: ``lip train --conv bcop``.
"""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ConvSpec, Param

from .bcop import TAPS, BCOPConv


def bcop_spec() -> ConvSpec:
    """The ``bcop`` conv spec: no promise (Björck's iteration is not exactly orthogonal);
    ``lipschitz_upper_bound()`` is a verified bound on the filter as used."""
    return ConvSpec(
        name="bcop",
        factory=BCOPConv,
        description="BCOP: block convolution orthogonal parametrisation (Li et al., NeurIPS 2019)",
        params=(
            Param(name="bjorck_iters", type=int, default=20, min=1, max=200,
                  help="Minimum Bjorck orthogonalisation steps per training step (then on to convergence; eval: to convergence)"),
            Param(name="taps", type=str, default="lipcli", choices=TAPS,
                  help="authors: each tap's matrix transposed when in*s^2 <= out (the BCOP authors' layout, "
                       "for lip import)"),
        ),
        promises=(),
    )


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [bcop_spec()]
