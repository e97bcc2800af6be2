"""The lipcli plugin module of lipcli-logit-annealing (entry point ``logit-annealing``): the
training loss ``la`` (Lai et al., ICLR 2025)."""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.losses import eps_schedule_params
from lipcli.sdk.specs import LossSpec, Param

from .loss import DEFAULT_EPS, MAX_GAMMA, la_factory


def la_spec() -> LossSpec:
    return LossSpec(
        name="la",
        factory=la_factory,
        description="Logit Annealing (Lai et al. 2025): tau*(1-p)^gamma*CE on offset, "
                    "EMMA-shifted logits",
        params=(
            Param(name="temperature", type=float, default=0.75, min=0.0, min_open=True, max=1e3, help="tau"),
            Param(name="offset", type=float, default=2.0, min=0.0, max=1e3, help="xi, subtracted from the true logit"),
            Param(name="gamma", type=float, default=5.0, min=0.0, max=MAX_GAMMA, help="annealing exponent"),
            Param(name="eps", type=float, default=DEFAULT_EPS, min=0.0, max=64.0,
                  help="EMMA radius in input space (0: plain logits, any head)"),
            Param(name="min_ratio", type=float, default=0.01, min=0.0, min_open=True, max=1.0,
                  help="EMMA clip floor"),
            Param(name="alpha", type=float, default=1.0, min=0.0, min_open=True, max=1e3,
                  help="focal factor, a scale of the loss (BRONet's LipConvNet code: 0.25)"),
            *eps_schedule_params(),
        ),
    )


@hookimpl
def lip_losses() -> list[LossSpec]:
    return [la_spec()]
