"""The generic ``margin`` certificate: certifies ANY head with a guaranteed Lipschitz bound.

If the head ``h: y -> logits`` is ``L``-Lipschitz in l2 (``||h(y) - h(y')|| <= L ||y - y'||``),
then for classes ``l`` and ``j`` the difference ``h_l - h_j = (e_l - e_j)ᵀ h`` is
``√2·L``-Lipschitz (``||e_l - e_j|| = √2``), so it cannot change sign on the open ball of
radius ``(h_l(y) - h_j(y)) / (√2 L)`` around ``y``.  The predicted class ``l`` is therefore
constant on the ball of radius

    r(y) = min_{j != l} (h_l(y) - h_j(y)) / (√2 L) = (h_l(y) - max_{j != l} h_j(y)) / (√2 L)

(Tsuzuku, Sato & Sugiyama, NeurIPS 2018, Proposition 1; Li et al., NeurIPS 2019).  The
pairwise minimum and the top-two margin are the same number because the denominator does
not depend on ``j``; ``√2 L`` is the best constant from ``L`` alone (for a linear head the
``lln`` certificate's per-pair ``||w_l - w_j|| <= √2 ||W||₂`` can only be larger).  lipcli's
driver then divides by the guaranteed bound of the feature map (input radius
``r / Lip(g)``), so the input-space radius is ``margin / (√2 · L_head · Lip(g))``.

What the head must provide (checked, never assumed): ``lipschitz_upper_bound()`` returning a
GUARANTEED l2 bound of ``features -> logits`` for its current weights, or the promise
``"1-lipschitz"`` (its spec's ``promises``; lipcli sets them as ``lip_promises`` on the built
module) for a head that is 1-Lipschitz by construction.  A head with neither is refused.
:func:`lipcli.testing.check_head_lipschitz` tests a head's declared bound.

Arithmetic: logits are recomputed in float64 on a float64 copy of the head.  Rounding: each
logit is taken to be within ``γ_{D+4} (2 L ||y|| + |h_i|)`` of its exact value and that is
subtracted from the margin; this is a proof for affine heads ``Wy + b`` (the error of a
length-``D`` dot product plus a bias is at most ``γ_{D+2} (|w_i|ᵀ|y| + |b_i|)``, with
``||w_i|| <= L`` and ``|b_i| <= |h_i| + L||y||``) and an allowance of the same size for
other heads.  The division and ``√2 L`` are rounded so that the radius is rounded down.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from lipcli.sdk.certificates import (
    HEURISTIC_NOTE,
    CertifyResult,
    cache_matches,
    competing_classes,
    make_cache,
)
from lipcli.sdk.errors import LipError
from lipcli.sdk.export import ExportedCertificate, lower_module
from lipcli.numerics.rounding import UNIT_ROUNDOFF as _U64
from lipcli.sdk.specs import ONE_LIPSCHITZ, SOUND

NAME = "margin"
#: √2 rounded up (the float64 nearest to √2 is above it; one more ulp for certainty)
SQRT2_UP = math.nextafter(math.sqrt(2.0), math.inf)


def head_lipschitz_bound(head: nn.Module) -> tuple[float, str]:
    """``(L, source)``: the head's guaranteed l2 Lipschitz bound and where it came from
    (``"lipschitz_upper_bound()"`` or ``"promise"``).  Raises :class:`LipError` for a head
    that declares neither, or an invalid bound."""
    method = getattr(head, "lipschitz_upper_bound", None)
    if callable(method):
        value = float(method())
        if not math.isfinite(value) or value <= 0:
            raise LipError(
                f"head {type(head).__name__} reported an invalid Lipschitz bound {value!r}"
            )
        return value, "lipschitz_upper_bound()"
    if ONE_LIPSCHITZ in getattr(head, "lip_promises", ()):
        return 1.0, "promise"
    raise LipError(
        f"the margin certificate needs a guaranteed Lipschitz bound of the head, but "
        f"{type(head).__name__} neither has lipschitz_upper_bound() nor promises "
        f"{ONE_LIPSCHITZ!r}"
    )


def margin_radius(
    logits: torch.Tensor,
    lipschitz: float,
    feature_norms: torch.Tensor,
    dim: int,
    candidates: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictions and radii ``min_j (h_l - h_j - err_l - err_j) / (√2 L)`` (float64, >= 0).

    ``logits``: ``(B, c)`` float64; ``feature_norms``: ``(B,)`` ``||y||``; ``dim``: ``D``;
    ``candidates``: optional ``(B, c)`` mask of competing classes (default all ``j != l``).
    """
    logits = logits.to(torch.float64)
    pred = logits.argmax(dim=1)
    own = pred.unsqueeze(1)
    if candidates is None:
        candidates, _ = competing_classes(logits, pred, None)
    gamma = (dim + 4) * _U64 / (1 - (dim + 4) * _U64)
    err = gamma * (2.0 * lipschitz * feature_norms.to(logits).unsqueeze(1) + logits.abs())
    margin = logits.gather(1, own) - logits - err.gather(1, own) - err
    margin = margin.masked_fill(~candidates, float("inf"))
    denominator = math.nextafter(SQRT2_UP * lipschitz, math.inf)
    radius = margin.min(dim=1).values / denominator * (1 - 4 * _U64)
    return pred, radius.clamp_min(0.0)


class MarginCertifier:
    """``margin / (√2 L)`` for any head with a guaranteed Lipschitz bound ``L`` (module doc)."""

    name = NAME
    promises = (SOUND,)

    def __init__(self) -> None:
        self.cache: dict = {}
        self._head64: tuple[int, nn.Module] | None = None

    def prepare(self, head: nn.Module, cache: dict | None = None) -> dict:
        """Computes ``L`` afresh (a stored value is never trusted) and records it."""
        lipschitz, source = head_lipschitz_bound(head)
        self.cache = cache if cache_matches(cache, self.name, head) else make_cache(self.name, head)
        self.cache.update(head_lipschitz_bound=lipschitz, head_lipschitz_source=source)
        self._head64 = None
        return self.cache

    def _float64_head(self, head: nn.Module) -> nn.Module:
        if self._head64 is None or self._head64[0] != id(head):
            try:
                head64 = copy.deepcopy(head).double().eval()
            except Exception as exc:  # noqa: BLE001 - foreign head code
                raise LipError(
                    f"the margin certificate evaluates the head in float64, but "
                    f"{type(head).__name__} cannot be copied to float64: {exc}"
                ) from None
            self._head64 = (id(head), head64)
        return self._head64[1]

    @torch.no_grad()
    def certify(
        self, head: nn.Module, features: torch.Tensor, *, top_k: int | None = None
    ) -> CertifyResult:
        lipschitz, source = head_lipschitz_bound(head)
        head64 = self._float64_head(head)
        param = next(head64.parameters(), None)
        device = param.device if param is not None else features.device
        y = features.detach().to(device=device, dtype=torch.float64)
        logits = head64(y).to(torch.float64)
        if logits.dim() != 2 or logits.shape[0] != y.shape[0]:
            raise LipError(f"the head returned logits of shape {tuple(logits.shape)}")
        if not bool(torch.isfinite(logits).all()):
            raise LipError("the head produced non-finite logits; cannot certify")
        pred = logits.argmax(dim=1)
        candidates, exact = competing_classes(logits, pred, top_k)
        pred, radius = margin_radius(logits, lipschitz, y.norm(dim=1), y.shape[1], candidates)
        notes = [
            "margin: radius = margin / (sqrt(2) * L_head), float64; L_head from the head's "
            f"{source}"
        ]
        if not exact:
            notes.append(HEURISTIC_NOTE.format(k=top_k, c=logits.shape[1] - 1))
        return CertifyResult(
            predictions=pred.cpu(),
            radius=radius.cpu(),
            exact_classes=exact,
            notes=notes,
            stats={"inputs": int(y.shape[0]), "head_lipschitz_bound_total": lipschitz},
        )

    def export_certificate(self, head: nn.Module):
        """``lip export --certify`` (:mod:`lipcli.sdk.export`): :class:`MarginRadius`,
        the same float64 arithmetic over all classes with ``L`` computed now (never read from
        the model file) and the head lowered in float64 through the export protocol."""
        lipschitz, source = head_lipschitz_bound(head)
        with torch.no_grad():
            head64 = lower_module(self._float64_head(head), "the head (float64 copy)")
        module = MarginRadius(head64, lipschitz)
        return ExportedCertificate(
            module=module,
            reference=lambda features: self.certify(head, features).radius,
            kind=self.name,
            description="margin / (sqrt(2) L_head) over all classes, float64 with rounding "
            f"allowances subtracted; L_head = {lipschitz!r} from the head's {source} at export",
            record={"head_lipschitz_bound": lipschitz, "head_lipschitz_source": source},
        )


class MarginRadius(nn.Module):
    """Features ``(N, D)`` -> ``(predictions, radius float64)``: :func:`margin_radius` over
    all classes in plain torch operations (what ``lip export --certify`` writes), on the
    float64 stand-in ``head64`` of the head with the fixed bound ``lipschitz``."""

    def __init__(self, head64: nn.Module, lipschitz: float) -> None:
        super().__init__()
        self.head = head64
        self.lipschitz = float(lipschitz)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = features.to(torch.float64)
        logits = self.head(y).to(torch.float64)
        pred = logits.argmax(dim=1)
        classes = torch.arange(logits.shape[1], device=logits.device)
        candidates = classes.unsqueeze(0) != pred.unsqueeze(1)
        return margin_radius(logits, self.lipschitz, y.norm(dim=1), y.shape[1], candidates)
