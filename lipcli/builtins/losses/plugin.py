"""The loss built-in plugin (registered as ``lipcli.losses``): the training losses ``ce``,
``cr`` and ``margin-offset``, implemented in :mod:`lipcli.builtins.losses.objectives`."""

from __future__ import annotations

import math

from lipcli.builtins.losses.objectives import (
    DEFAULT_EPS,
    CertificateRegularizedLoss,
    CrossEntropyLoss,
    MarginOffsetLoss,
)
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.losses import LossContext
from lipcli.sdk.specs import LossSpec, Param

__all__ = ["lip_losses"]


def _ce_factory(context: LossContext) -> CrossEntropyLoss:
    return CrossEntropyLoss()


def _cr_factory(context: LossContext, *, gamma: float = 0.1) -> CertificateRegularizedLoss:
    if not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError("gamma must be a finite number >= 0")
    return CertificateRegularizedLoss(context, gamma=gamma)


def _offset_factory(context: LossContext, *, eps: float = DEFAULT_EPS,
                    temperature: float = 0.25) -> MarginOffsetLoss:
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError("eps must be a finite number >= 0")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError("temperature must be positive")
    return MarginOffsetLoss(context, eps=eps, temperature=temperature)


@hookimpl
def lip_losses() -> list[LossSpec]:
    return [
        LossSpec(name="ce", factory=_ce_factory,
                 description="cross-entropy of the clean logits (the LLN head's loss)"),
        LossSpec(
            name="cr", factory=_cr_factory,
            description="CE minus gamma * mean relu(certificate) for affine heads (paper code's CR)",
            params=(Param(name="gamma", type=float, default=0.1, min=0.0, max=1e4,
                          help="certificate weight (0 = plain cross-entropy)"),),
        ),
        LossSpec(
            name="margin-offset", factory=_offset_factory,
            description="offset cross-entropy (Prach & Lampert 2022): offset sqrt(2)*eps*L, temperature",
            params=(
                Param(name="eps", type=float, default=DEFAULT_EPS, min=0.0, max=64.0,
                      help="input-space radius of the margin (offset sqrt(2)*eps/min(std))"),
                Param(name="temperature", type=float, default=0.25, min=0.0, min_open=True, max=1e3,
                      help="logit temperature tau"),
            ),
        ),
    ]

