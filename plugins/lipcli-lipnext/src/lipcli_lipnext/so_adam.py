"""``so-adam``: Adam on the orthogonal manifold for the parameters a layer declared
(:mod:`lipcli.sdk.orthogonal`), the Euclidean optimiser of the user's choice for all others, in
the same step (LipNeXt §3 as LIPNEXT.md reads it; the first author's ``SOOptimizer`` [C1]).

Per declared ``X`` (row-orthonormal ``(…, n, m)``; square: orthogonal) with gradient ``G``:

1. ``A = ½(XᵀG − GᵀX) ∈ so(m)`` (:func:`~lipcli_lipnext.fastexp.lie_gradient`);
2. Adam moments on ``A`` elementwise (``m``, ``v``, bias corrections): both stay exactly skew
   resp. symmetric, because ``A`` is exactly skew;
3. ``U = −lr·m̂/(√v̂ + eps)``, skew (made exactly so: ``½(U − Uᵀ)``), in float64;
4. ``X ← X·FastExp(U)`` in float64, cast back (orders 2/3/4 by ‖U‖_F < 0.05/0.25/1, else
   the exact exponential).

With ``--lookahead K`` (α = ``--lookahead-alpha``): every ``K`` steps the slow copy moves along
the manifold, ``X_slow ← X_slow·FastExp(α·ΣU_j)`` over the last ``K`` updates (the first-order
BCH estimate of the geodesic to the fast weights), and the fast weights restart from it; the
other parameters take lipcli's Euclidean Lookahead with the same ``K`` and α.  After each epoch
(:meth:`SOAdam.end_epoch`) every matrix whose ``‖XXᵀ − I‖_F`` exceeds ``retract_tol`` is
replaced by its polar factor.  Everything that the next step reads is in :meth:`state_dict`.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch import Tensor

from lipcli.sdk.orthogonal import OrthogonalParameter

from .fastexp import fast_exp, lie_gradient, polar

__all__ = ["SOAdam"]


class SOAdam(torch.optim.Optimizer):
    """The manifold part (its own parameter group, ``"manifold": True``) plus ``euclid`` (any
    optimiser over the other parameters, or ``None``).  ``param_groups`` are the Euclidean
    optimiser's followed by the manifold group, so a schedule acts on both."""

    def __init__(self, euclid: torch.optim.Optimizer | None, ortho: list[OrthogonalParameter], *,
                 lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 retract_tol: float = 1e-5, lookahead: int = 0, lookahead_alpha: float = 0.5,
                 exact: bool = False) -> None:
        if not ortho:
            raise ValueError("so-adam needs declared orthogonal parameters (lipcli.sdk.orthogonal); "
                             "this model has none")
        self.euclid = euclid
        self.names = [o.name for o in ortho]
        self.group: dict[str, Any] = {"params": [o.param for o in ortho], "lr": lr, "weight_decay": 0.0,
                                      "betas": tuple(betas), "eps": eps, "manifold": True}
        self.retract_tol, self.exact = float(retract_tol), bool(exact)
        self.k, self.alpha = int(lookahead), float(lookahead_alpha)
        self.defaults = dict(euclid.defaults) if euclid is not None else {"lr": lr}
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                      "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                      "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks"):
            setattr(self, hooks, collections.OrderedDict())
        params = self.group["params"]
        self.t = 0
        self.v = [torch.zeros(p.shape[:-2] + (p.shape[-1], p.shape[-1]), dtype=p.dtype, device=p.device)
                  for p in params]
        self.m = [torch.zeros_like(v) for v in self.v]
        self.slow = [p.detach().clone() for p in params] if self.k else []
        self.delta = [torch.zeros_like(v, dtype=torch.float64) for v in self.v] if self.k else []
        self.count = 0
        self.orders: collections.Counter = collections.Counter()
        self.retractions = 0

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return (self.euclid.param_groups if self.euclid is not None else []) + [self.group]

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.euclid.state if self.euclid is not None else {}

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = self.euclid.step(closure) if self.euclid is not None else (closure() if closure else None)
        self.t += 1
        b1, b2 = self.group["betas"]
        lr, eps = float(self.group["lr"]), float(self.group["eps"])
        c1, c2 = 1.0 - b1 ** self.t, 1.0 - b2 ** self.t
        for i, X in enumerate(self.group["params"]):
            if X.grad is None:
                continue
            A = lie_gradient(X.detach().float(), X.grad.float()).to(self.m[i].dtype)
            self.m[i].lerp_(A, 1.0 - b1)
            self.v[i].mul_(b2).addcmul_(A, A, value=1.0 - b2)
            U = -lr * (self.m[i].double() / c1) / ((self.v[i].double() / c2).sqrt() + eps)
            U = 0.5 * (U - U.mT)
            E = self._exp(U)
            X.copy_((X.detach().double() @ E).to(X.dtype))
            if self.k:
                self.delta[i].add_(U)
        if self.k:
            self.count += 1
            if self.count % self.k == 0:
                self._sync_lookahead()
        return loss

    def _exp(self, U: Tensor) -> Tensor:
        if self.exact:
            self.orders["exact"] += 1
            return torch.linalg.matrix_exp(U)
        E, order = fast_exp(U)
        self.orders[str(order) if order else "exact"] += 1
        return E

    def _sync_lookahead(self) -> None:
        for i, X in enumerate(self.group["params"]):
            slow = self.slow[i]
            slow.copy_((slow.double() @ self._exp(self.alpha * self.delta[i])).to(slow.dtype))
            X.copy_(slow)
            self.delta[i].zero_()

    @torch.no_grad()
    def end_epoch(self) -> None:
        """The polar retraction of every matrix (and slow copy) off the manifold by more than
        ``retract_tol`` (``‖XXᵀ − I‖_F``, float64)."""
        for X in [*self.group["params"], *self.slow]:
            X64 = X.detach().double()
            eye = torch.eye(X.shape[-2], dtype=torch.float64, device=X.device)
            defect = torch.linalg.matrix_norm(X64 @ X64.mT - eye).max()
            if float(defect) > self.retract_tol:
                X.copy_(polar(X).to(X.dtype))
                self.retractions += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.euclid is not None:
            self.euclid.zero_grad(set_to_none=set_to_none)
        for p in self.group["params"]:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def record(self) -> dict[str, Any]:
        """What the model file records of the manifold part."""
        return {"orthogonal_parameters": list(self.names), "fastexp_orders": dict(sorted(self.orders.items())),
                "retractions": self.retractions}

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"euclid": self.euclid.state_dict() if self.euclid is not None else None,
                "group": {k: v for k, v in self.group.items() if k != "params"},
                "t": self.t, "m": [x.clone() for x in self.m], "v": [x.clone() for x in self.v],
                "slow": [x.clone() for x in self.slow], "delta": [x.clone() for x in self.delta],
                "count": self.count, "orders": dict(self.orders), "retractions": self.retractions}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        if self.euclid is not None:
            self.euclid.load_state_dict(state_dict["euclid"])
        for key, value in state_dict["group"].items():
            self.group[key] = tuple(value) if key == "betas" else value
        self.t, self.count = int(state_dict["t"]), int(state_dict["count"])
        for mine, saved in zip([*self.m, *self.v, *self.slow, *self.delta],
                               [*state_dict["m"], *state_dict["v"], *state_dict["slow"], *state_dict["delta"]]):
            mine.copy_(saved)
        self.orders = collections.Counter({str(k): int(v) for k, v in state_dict["orders"].items()})
        self.retractions = int(state_dict["retractions"])
