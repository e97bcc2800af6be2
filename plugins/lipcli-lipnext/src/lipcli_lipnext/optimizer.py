"""The ``so-adam`` optimiser component: its parameters and factory (the optimiser:
:mod:`.so_adam`)."""

from __future__ import annotations

from typing import Any

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.optimizers import OptimizerContext
from lipcli.sdk.orthogonal import orthogonal_parameters
from lipcli.sdk.specs import OptimizerSpec, Param

from .so_adam import SOAdam

#: the Euclidean optimisers so-adam can step the other parameters with (lipcli's built-ins)
EUCLIDEAN = ("nadam", "adamw", "sgd")
#: the learning rate when --lr is not given (LipNeXt: "η ~ 1e-3"; LiResNet's 1e-3)
DEFAULT_LR = 1e-3


def so_adam_factory(context: OptimizerContext, *, euclidean: str = "nadam", so_lr: float = 0.5,
                    so_beta1: float = 0.9, so_beta2: float = 0.999, so_eps: float = 1e-8,
                    retract_tol: float = 1e-5, exact: bool = False) -> SOAdam:
    """so-adam over ``context``: the declared parameters on the manifold at ``so_lr × lr``, the
    others with ``euclidean`` (its own weight-decay groups, the run's --betas/--momentum)."""
    ortho = orthogonal_parameters(context.model)
    if not ortho:
        raise LipUsageError("optimizer 'so-adam' trains parameters a layer declared orthogonal "
                            "(lipcli.sdk.orthogonal); this model declares none (use --arch lipnext, "
                            "or another optimizer)")
    ids = {id(o.param) for o in ortho}
    groups: list[dict[str, Any]] = []
    for g in context.groups:
        keep = [(n, p) for n, p in zip(g["names"], g["params"]) if id(p) not in ids]
        groups.append({**g, "params": [p for _, p in keep], "names": [n for n, _ in keep]})
    euclid = None
    if any(g["params"] for g in groups):
        euclid = context.euclidean(euclidean, [g for g in groups if g["params"]])
        if context.lookahead:
            euclid = context.lookahead_wrapper(euclid)
    return SOAdam(euclid, ortho, lr=context.lr * so_lr, betas=(so_beta1, so_beta2), eps=so_eps,
                  retract_tol=retract_tol, lookahead=context.lookahead,
                  lookahead_alpha=context.lookahead_alpha, exact=exact)


def so_adam_spec() -> OptimizerSpec:
    return OptimizerSpec(
        name="so-adam",
        factory=so_adam_factory,
        default_lr=DEFAULT_LR,
        description="Adam in the Lie algebra of the declared orthogonal/Stiefel parameters, "
                    "X <- X FastExp(U) in float64, polar retraction per epoch; the rest Euclidean",
        params=(
            Param(name="euclidean", type=str, default="nadam", choices=EUCLIDEAN,
                  help="optimiser of the other parameters (LiResNet's: nadam)"),
            Param(name="so_lr", type=float, default=0.5, min=0.0, min_open=True, max=100.0,
                  help="manifold learning rate as a multiple of --lr (first author's code: 0.5)"),
            Param(name="so_beta1", type=float, default=0.9, min=0.0, max=1.0, max_open=True,
                  help="Adam beta1 in the Lie algebra"),
            Param(name="so_beta2", type=float, default=0.999, min=0.0, max=1.0, max_open=True,
                  help="Adam beta2 in the Lie algebra"),
            Param(name="so_eps", type=float, default=1e-8, min=0.0, min_open=True, max=1.0,
                  help="Adam eps in the Lie algebra"),
            Param(name="retract_tol", type=float, default=1e-5, min=0.0, max=1.0,
                  help="polar retraction after an epoch where ||XX^T - I||_F exceeds this"),
            Param(name="exact", type=bool, default=False,
                  help="the exact matrix exponential every step instead of FastExp"),
        ),
    )
