"""The lipcli plugin module (entry point ``cpl`` in the ``lipcli`` group).

Provides the convolution ``cpl`` (``lip train --conv cpl``; ``--conv cpl:hidden=N``): the
Convex Potential Layer with a proven bound (:mod:`lipcli_cpl.core`).
"""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ConvSpec, Param

from .conv import CPLConv
from .core import EVAL_STEP_CHOICES

#: the largest hidden-channel count
MAX_HIDDEN = 65536


def factory(in_channels: int, out_channels: int, kernel_size: int, stride: int, *, hidden: int = 0,
            eval_step: str = "verified") -> CPLConv:
    """ConvSpec factory (channel handling: :mod:`lipcli_cpl.conv`)."""
    return CPLConv(in_channels, out_channels, kernel_size, stride, hidden=hidden, eval_step=eval_step)


def cpl_spec() -> ConvSpec:
    """The ``cpl`` conv spec: no promise (rounding; with ``eval_step=authors`` power iteration
    approaches ``‖W‖`` from below); the layer's ``lipschitz_upper_bound()`` is
    ``max(1, h·σ̄² − 1)`` with a verified ``σ̄``."""
    return ConvSpec(
        name="cpl",
        factory=factory,
        description="CPL: convex potential layer x - 2/|W|^2 W^T relu(Wx + b) (Meunier et al., ICML 2022), "
                    "bounded with a verified |W|",
        params=(
            Param(name="hidden", type=int, default=0, min=1, max=MAX_HIDDEN, auto=0,
                  help="hidden channels of W as a count (0: the layer's channels, as in the comparison study)"),
            Param(name="eval_step", type=str, default="verified", choices=EVAL_STEP_CHOICES,
                  help="eval step h: verified (just below 2/|W|^2 from the verified norm: bound 1) or "
                       "authors (the study's 100-step estimate: its outputs, bound max(1, h|W|^2 - 1))"),
        ),
        promises=(),
    )


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [cpl_spec()]
