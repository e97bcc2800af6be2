"""The SOC built-in plugin (registered as ``lipcli.soc``): the ``soc`` and ``soc-fast``
convolutions (skew orthogonal convolution, exact and fast weight gradient; SPEC §2)."""

from __future__ import annotations

import functools

from lipcli.builtins.soc.layer import MAX_POWER_ITERS, MAX_TERMS, SOC
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ORTHOGONAL, ConvSpec, Param

__all__ = ["lip_convolutions"]


# --------------------------------------------------------------------------------------
# Plugin hook
# --------------------------------------------------------------------------------------
_PARAMS = (
    Param(name="train_terms", type=int, default=6, min=2, max=MAX_TERMS,
          help="terms of the exponential series during training (paper §4, eq. 1)"),
    Param(name="eval_terms", type=int, default=15, min=2, max=MAX_TERMS,
          help="terms of the exponential series at evaluation/certification (paper §4, eq. 1)"),
    Param(name="power_iters", type=int, default=1, min=0, max=MAX_POWER_ITERS,
          help="power-iteration steps per training forward for the filter norm σ"),
)


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    """``soc-fast`` (default: SOC with the paper's fast filter gradient) and ``soc``
    (exact-gradient baseline); same parameters, same forward."""
    variants = (
        ("soc-fast", True, "Skew orthogonal convolution with the fast one-conv filter gradient"),
        ("soc", False, "Skew orthogonal convolution, exact autograd gradient (baseline)"),
    )
    return [
        ConvSpec(name=name, factory=functools.partial(SOC, fast_grad=fast), description=description,
                 params=_PARAMS, promises=(ORTHOGONAL,))
        for name, fast, description in variants
    ]
