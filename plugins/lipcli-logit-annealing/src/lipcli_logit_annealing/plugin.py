"""The lipcli plugin module of lipcli-logit-annealing (entry point ``logit-annealing``): the
training loss ``la`` (Lai et al., ICLR 2025)."""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import LossSpec, Param

from .loss import DEFAULT_EPS, la_factory


def la_spec() -> LossSpec:
    return LossSpec(
        name="la",
        factory=la_factory,
        description="Logit Annealing (Lai et al. 2025): tau*(1-p)^gamma*CE on offset, "
                    "EMMA-shifted logits",
        params=(
            Param(name="temperature", type=float, default=0.75, help="tau > 0"),
            Param(name="offset", type=float, default=2.0, help="xi >= 0, subtracted from the true logit"),
            Param(name="gamma", type=float, default=5.0, help="annealing exponent in [0, 100]"),
            Param(name="eps", type=float, default=DEFAULT_EPS,
                  help="EMMA radius in input space (0: plain logits, any head)"),
            Param(name="min_ratio", type=float, default=0.01, help="EMMA clip floor in (0, 1]"),
        ),
    )


@hookimpl
def lip_losses() -> list[LossSpec]:
    return [la_spec()]
